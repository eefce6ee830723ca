#!/usr/bin/env bash
# The kind suite (test/cluster) on a machine with a Docker engine and a registry, the usual way:
#
# 1. creates a kind cluster (KIND_CLUSTER, default a2a-fleet-e2e) with kind's own node image
#    unless it exists;
# 2. builds the four images from the Dockerfile (`make docker-build`: the names the manifests
#    use, or IMG, SERVICE_IMG, EXAMPLES_IMG, MOSQUITTO_IMG) and loads them into the cluster;
# 3. runs test/cluster against it (make test-e2e): the quickstart and the chart installed, the
#    samples' agents as pods, chats through the conversation service, a rotation, a deletion, and
#    killed pods.
# On this project's own machines (no registry) `make kind-up` builds the cluster and the images
# offline instead, and `make test` runs the same suite. KEEP_CLUSTER=1 keeps the cluster afterwards
# (it is deleted only when this script created it).
set -euo pipefail

cd "$(dirname "$0")/.."
CLUSTER="${KIND_CLUSTER:-a2a-fleet-e2e}"
KIND="${KIND:-kind}"
for tool in docker "$KIND" go make; do
	command -v "$tool" >/dev/null || { echo "kind-e2e: $tool not found" >&2; exit 1; }
done
docker info >/dev/null 2>&1 || { echo "kind-e2e: no Docker engine reachable" >&2; exit 1; }

created=0
if ! "$KIND" get clusters | grep -qx "$CLUSTER"; then
	"$KIND" create cluster --name "$CLUSTER" --wait 120s
	created=1
fi
work="$(mktemp -d)"
cleanup() {
	rm -rf "$work"
	if [[ "$created" == 1 && "${KEEP_CLUSTER:-0}" != 1 ]]; then "$KIND" delete cluster --name "$CLUSTER"; fi
}
trap cleanup EXIT
export KUBECONFIG="$work/kubeconfig"
"$KIND" get kubeconfig --name "$CLUSTER" >"$KUBECONFIG"

echo "== images (the Dockerfile's four targets)"
make docker-build
images=()
for var in IMG SERVICE_IMG EXAMPLES_IMG MOSQUITTO_IMG; do
	images+=("$(make -s --no-print-directory print-$var)")
done
"$KIND" load docker-image --name "$CLUSTER" "${images[@]}"

echo "== the kind suite (test/cluster)"
make test-e2e
