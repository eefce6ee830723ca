#!/usr/bin/env bash
# Loads the release bundle's images (dist/images/*.tar.gz, written by make release) into the kind
# cluster of hack/kind/up.sh with `kind load image-archive`, as a user of the bundle would. The
# archives are gzipped; kind hands an archive to the node's `ctr images import`, which reads
# compressed archives only in recent containerd versions, so each is uncompressed first.
#   hack/release-kind-load.sh        (DIST=dist, KIND_CLUSTER=a2a-fleet)
set -euo pipefail
cd "$(dirname "$0")/.."
source hack/kind/lib.sh
dist="${DIST:-dist}"
kind="$KIND_STATE/bin/kind-$KIND_VERSION"
[[ -x $kind ]] || die "kind $KIND_VERSION is not built: make kind-up"
shopt -s nullglob
archives=("$dist"/images/*.tar.gz)
((${#archives[@]} > 0)) || die "no image archives in $dist/images: make release"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
for archive in "${archives[@]}"; do
	gunzip -c "$archive" >"$tmp/image.tar"
	"$kind" load image-archive --name "$KIND_CLUSTER" "$tmp/image.tar" >/dev/null
	log "loaded $(basename "$archive") into $KIND_CLUSTER"
done

# Every load leaves the image it replaced in the node's containerd under its digest alone (and
# kind's import under an `import-…` name): across repeated `make test` runs they grew the node's
# volume by gigabytes until the disk filled. Drop every such reference whose manifest no named
# image shares; containerd's garbage collector then frees its content and snapshots (a running
# container keeps its own snapshot).
docker exec "$KIND_CLUSTER-control-plane" sh -c '
	ctr -n k8s.io images ls | awk '"'"'NR > 1 {
		if ($1 ~ /^(sha256:|import-)/) candidate[$1] = $3; else named[$3] = 1
	} END { for (ref in candidate) if (!(candidate[ref] in named)) print ref }'"'"' |
		xargs -r ctr -n k8s.io images rm >/dev/null'
log "dropped the images the loads replaced from $KIND_CLUSTER"
