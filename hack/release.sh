#!/usr/bin/env bash
# Writes the release bundle of the VERSION file's version into dist/ (make release):
#   a2a-fleet-VERSION.tgz                      the Helm chart, packaged (helm package)
#   a2actl-VERSION-{linux,darwin}-{amd64,arm64} the CLI, static, stamped with VERSION and the commit
#   images/*.tar                                the four images (docker save), when IMAGES=1 and a
#                                               Docker engine holds them (make docker-build or
#                                               make docker-images first); loadable with
#                                               `docker load` or `kind load image-archive`
#   SHA256SUMS                                  checksums of all of the above
# A draft: no SBOM yet, and make test does not install from the bundle yet (docs/install.md).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${HELM:?HELM must name the helm binary (make release sets it)}"
version="$(cat VERSION)"
commit="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
module=github.com/a2a-fleet/a2a-fleet
ldflags="-s -w -X $module/internal/version.Version=$version -X $module/internal/version.Commit=$commit"
dist=dist
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

if [ "${IMAGES:-0}" = 1 ]; then
	mkdir -p "$dist/images"
	for image in "${IMG:-a2a-fleet/operator:dev}" "${SERVICE_IMG:-a2a-fleet/conversation-service:dev}" \
		"${EXAMPLES_IMG:-a2a-fleet/example-agents:dev}" "${MOSQUITTO_IMG:-a2a-fleet/mosquitto:dev}"; do
		name="$(basename "${image%%:*}")"
		docker save -o "$dist/images/$name.tar" "$image"
	done
fi

(cd "$dist" && find . -type f ! -name SHA256SUMS | sed 's#^\./##' | sort | xargs sha256sum > SHA256SUMS)
echo "release $version ($commit) in $dist/:"
(cd "$dist" && cat SHA256SUMS)
