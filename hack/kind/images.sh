#!/usr/bin/env bash
# Builds the project's images from its one Dockerfile with the project's dockerd, offline: the
# base images are the ones hack/kind/rootfs.sh made (build arguments GO_IMAGE, RUNTIME_IMAGE,
# DEBIAN_IMAGE), the names are the ones the manifests use (make docker-build's). BuildKit's
# layer and cache mounts make a rebuild after a source change take a relink, not a cold build.
# Writes the list of images to A2A_FLEET_CACHE/kind/project-images for up.sh to load.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
repo="$(cd "$(dirname "$0")/../.." && pwd)"

IMG="${IMG:-a2a-fleet/operator:dev}"
SERVICE_IMG="${SERVICE_IMG:-a2a-fleet/conversation-service:dev}"
EXAMPLES_IMG="${EXAMPLES_IMG:-a2a-fleet/example-agents:dev}"
MOSQUITTO_IMG="${MOSQUITTO_IMG:-a2a-fleet/mosquitto:dev}"
DECISION_IMG="${DECISION_IMG:-a2a-fleet/decision-service:dev}"
GATEWAY_IMG="${GATEWAY_IMG:-a2a-fleet/gateway:dev}"

"$(dirname "$0")/dockerd.sh" >/dev/null
"$(dirname "$0")/rootfs.sh"
mkdir -p "$KIND_STATE"
: >"$KIND_STATE/project-images.tmp"
# The one list of targets and their images (make docker-build builds the same).
images=("manager $IMG" "conversation-service $SERVICE_IMG" "example-agents $EXAMPLES_IMG" "mosquitto $MOSQUITTO_IMG"
	"decision-service $DECISION_IMG" "gateway $GATEWAY_IMG")
for spec in "${images[@]}"; do
	read -r target image <<<"$spec"
	start=$SECONDS
	# --network host: the build reaches Debian's mirror and the Go module proxy as this machine
	# does (the engine has no bridge network of its own).
	docker build --network host -q \
		--build-arg GO_IMAGE="$LOCAL_GO_IMAGE" --build-arg RUNTIME_IMAGE="$LOCAL_STATIC_IMAGE" \
		--build-arg DEBIAN_IMAGE="$LOCAL_DEBIAN_IMAGE" \
		--build-arg VERSION="$(cat "$repo/VERSION")" \
		--build-arg COMMIT="$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)" \
		--target "$target" -t "$image" "$repo" >/dev/null ||
		die "docker build --target $target failed (rerun without -q to see why)"
	log "$image (target $target) built in $((SECONDS - start)) s"
	echo "$image" >>"$KIND_STATE/project-images.tmp"
done
mv -f "$KIND_STATE/project-images.tmp" "$KIND_STATE/project-images"
