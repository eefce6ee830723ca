#!/usr/bin/env bash
# Builds the previous release's bundle (hack/previous-release: version and commit) once and keeps
# it outside the clone, in A2A_FLEET_CACHE/releases/VERSION-COMMIT/:
#   dist/     what that commit's own `make release` wrote (chart, a2actl, images, SBOM, SHA256SUMS)
#   config/   that commit's kustomize tree (config/quickstart, config/samples-workloads, ...)
# The upgrade test installs it and upgrades to the working tree. The commit is checked out with
# `git worktree add --detach` into the cache (never inside the clone), built there with the shared
# A2A_FLEET_CACHE (the project's dockerd, its base images and BuildKit cache) and the Go build
# cache, then removed. Its images are tagged with its version (a2a-fleet/operator:VERSION, ...),
# not :dev, so that loading them into kind never replaces the working tree's images.
# When the folder exists, nothing is built.
#   hack/previous-release.sh            build (or find) it and print its folder
#   hack/previous-release.sh --print    print the folder only
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
# shellcheck source=hack/previous-release
source hack/previous-release
cache="${A2A_FLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/a2a-fleet}"
out="$cache/releases/$version-$commit"
if [ "${1:-}" = --print ]; then
	echo "$out"
	exit 0
fi
log() { printf '[previous-release] %s\n' "$*" >&2; }
if [ -f "$out/dist/SHA256SUMS" ] && [ -d "$out/config" ]; then
	log "$version ($commit) already built in $out"
	echo "$out"
	exit 0
fi
: "${HELM:?HELM must name the helm binary (make previous-release sets it)}"
git cat-file -e "$commit^{commit}" 2>/dev/null || {
	log "ERROR: commit $commit of $version is not in this clone's history (a shallow clone? git fetch --unshallow)"
	exit 1
}
start=$SECONDS
src="$cache/releases/src-$version-$commit"
mkdir -p "$cache/releases"
git worktree remove --force "$src" 2>/dev/null || rm -rf "$src"
git worktree prune
git worktree add --detach "$src" "$commit" >/dev/null
# The kind scripts keep the list of images `make kind-up` loads (hack/kind/images.sh writes it):
# the previous release's build must not replace the working tree's list.
images_list="$cache/kind/project-images"
saved=""
if [ -f "$images_list" ]; then
	saved="$(mktemp)"
	cp "$images_list" "$saved"
fi
cleanup() {
	if [ -n "$saved" ]; then mv -f "$saved" "$images_list"; fi
	git -C "$repo" worktree remove --force "$src" 2>/dev/null || rm -rf "$src"
	git -C "$repo" worktree prune
}
trap cleanup EXIT
tag="$version"
A2A_FLEET_CACHE="$cache" make -C "$src" -s release HELM="$HELM" \
	IMG="a2a-fleet/operator:$tag" SERVICE_IMG="a2a-fleet/conversation-service:$tag" \
	EXAMPLES_IMG="a2a-fleet/example-agents:$tag" MOSQUITTO_IMG="a2a-fleet/mosquitto:$tag" \
	DECISION_IMG="a2a-fleet/decision-service:$tag" GATEWAY_IMG="a2a-fleet/gateway:$tag" >&2
rm -rf "$out.tmp"
mkdir -p "$out.tmp"
cp -a "$src/dist" "$src/config" "$out.tmp/"
mv "$out.tmp" "$out"
log "$version ($commit) built in $out in $((SECONDS - start)) s"
echo "$out"
