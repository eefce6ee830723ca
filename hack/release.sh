#!/usr/bin/env bash
# Writes the release bundle of the VERSION file's version into dist/ (make release):
#   a2a-fleet-VERSION.tgz                       the Helm chart, packaged (helm package)
#   a2actl-VERSION-{linux,darwin}-{amd64,arm64} the CLI, static, stamped with VERSION and the commit
#   images/{operator,conversation-service,example-agents,mosquitto,decision-service,gateway}.tar.gz
#                                               the six images (docker save | gzip) from the
#                                               project's dockerd (hack/kind; make docker-images
#                                               builds them), as the manifests name them:
#                                               `docker load -i FILE`, or gunzip and
#                                               `kind load image-archive FILE.tar`
#   a2a-fleet-VERSION.cdx.json                  the SBOM: CycloneDX JSON of the module's build list
#                                               and of the Debian packages in each image
#                                               (hack/sbom)
#   SHA256SUMS                                  checksums of all of the above
# IMAGES=0 leaves the images out (a bundle without them is incomplete: test/release fails on it).
# The images must carry VERSION and this commit in their OCI labels (built from this tree);
# RELEASE_ALLOW_IMAGE_REVISION=1 accepts images of another commit of the same VERSION.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${HELM:?HELM must name the helm binary (make release sets it)}"
version="$(cat VERSION)"
commit="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
module=github.com/a2a-fleet/a2a-fleet
ldflags="-s -w -X $module/internal/version.Version=$version -X $module/internal/version.Commit=$commit"
dist="${DIST:-dist}"
rm -rf "$dist"
mkdir -p "$dist"

chart_version="$(sed -n 's/^version: *//p' charts/a2a-fleet/Chart.yaml)"
if [ "$chart_version" != "$version" ]; then
	echo "release: charts/a2a-fleet/Chart.yaml version $chart_version is not VERSION $version (make verify-version)" >&2
	exit 1
fi
"$HELM" package charts/a2a-fleet --destination "$dist" >/dev/null

for os in linux darwin; do
	for arch in amd64 arm64; do
		CGO_ENABLED=0 GOOS=$os GOARCH=$arch go build -trimpath -ldflags "$ldflags" \
			-o "$dist/a2actl-$version-$os-$arch" ./cmd/a2actl
	done
done

if [ "${IMAGES:-1}" = 1 ]; then
	# The project's dockerd (hack/kind/lib.sh sets DOCKER_HOST; A2A_FLEET_DOCKER_HOST points it
	# at another engine).
	# shellcheck source=hack/kind/lib.sh
	source hack/kind/lib.sh
	mkdir -p "$dist/images"
	for image in "${IMG:-a2a-fleet/operator:dev}" "${SERVICE_IMG:-a2a-fleet/conversation-service:dev}" \
		"${EXAMPLES_IMG:-a2a-fleet/example-agents:dev}" "${MOSQUITTO_IMG:-a2a-fleet/mosquitto:dev}" \
		"${DECISION_IMG:-a2a-fleet/decision-service:dev}" "${GATEWAY_IMG:-a2a-fleet/gateway:dev}"; do
		name="$(basename "${image%%:*}")"
		labels="$(docker image inspect --format '{{index .Config.Labels "org.opencontainers.image.version"}} {{index .Config.Labels "org.opencontainers.image.revision"}}' "$image")" ||
			die "image $image not found on $DOCKER_HOST: make docker-images"
		read -r image_version image_revision <<<"$labels"
		[ "$image_version" = "$version" ] || die "image $image is version '$image_version', not $version: make docker-images"
		if [ "$image_revision" != "$commit" ] && [ "${RELEASE_ALLOW_IMAGE_REVISION:-0}" != 1 ]; then
			die "image $image was built from $image_revision, not $commit: make docker-images (or RELEASE_ALLOW_IMAGE_REVISION=1)"
		fi
		docker save "$image" | gzip -n >"$dist/images/$name.tar.gz"
	done
fi

# After the images: the SBOM reads their dpkg databases from the archives.
sbom_images=()
if [ "${IMAGES:-1}" = 1 ]; then
	sbom_images=(-images "$dist/images")
fi
go run ./hack/sbom -version "$version" -commit "$commit" "${sbom_images[@]}" -o "$dist/a2a-fleet-$version.cdx.json"

(cd "$dist" && find . -type f ! -name SHA256SUMS | sed 's#^\./##' | sort | xargs sha256sum >SHA256SUMS)
echo "release $version ($commit) in $dist/:"
(cd "$dist" && cat SHA256SUMS)
