#!/usr/bin/env bash
# Deletes the kind cluster and its Docker network and stops the project's dockerd. The cache
# (A2A_FLEET_CACHE: images, node image, built binaries) stays, so the next `make kind-up` is quick.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
kind="$KIND_STATE/bin/kind-$KIND_VERSION"
if docker info >/dev/null 2>&1; then
	export PATH="$(dirname "$DOCKER"):$PATH"
	if [[ -x $kind ]]; then "$kind" delete cluster --name "$KIND_CLUSTER" >/dev/null 2>&1 || true; fi
	docker network rm "$KIND_NETWORK_NAME" >/dev/null 2>&1 || true
	rm -rf "$KIND_STATE/loaded"
fi
"$(dirname "$0")/dockerd.sh" --stop
# kind bind-mounts /lib/modules into the node, which makes Docker create it on a host that has
# none; remove it again when it is the empty folder Docker left.
rmdir /lib/modules 2>/dev/null || true
