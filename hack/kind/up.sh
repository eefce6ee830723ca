#!/usr/bin/env bash
# Creates (idempotently) the one-node kind cluster the kind suite runs on, offline:
#
#   hack/kind/up.sh      # dockerd, node image, the project's images, the cluster; prints KUBECONFIG=...
#
# 1. the project's dockerd (hack/kind/dockerd.sh) and the node image (hack/kind/node-image.sh);
# 2. the project's images from its one Dockerfile (hack/kind/images.sh);
# 3. kind (sigs.k8s.io/kind, built from the module proxy) creates the cluster from the node image
#    on a Docker network, pod subnet and service subnet in 198.18.0.0/15 (never a private range),
#    with no default CNI (the node's bridge conflist) and kubeadm pointed at the preloaded images;
# 4. the project's images and Redis are loaded into the node (`kind load docker-image`).
# The kubeconfig is A2A_FLEET_CACHE/kind/<cluster>.kubeconfig (the API server on 127.0.0.1 only).
# An existing cluster from the same node image is kept; one from another node image is recreated.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
repo="$(cd "$(dirname "$0")/../.." && pwd)"
kubeconfig="$KIND_KUBECONFIG"

"$(dirname "$0")/dockerd.sh" >/dev/null
"$(dirname "$0")/node-image.sh"
# KIND_SKIP_IMAGES=1: a second cluster (KIND_CLUSTER) beside the first takes the images the engine
# already has (the list in A2A_FLEET_CACHE/kind/project-images) instead of rebuilding the names
# the first cluster's users may be loading.
[[ ${KIND_SKIP_IMAGES:-} == 1 && -s $KIND_STATE/project-images ]] || "$(dirname "$0")/images.sh"

kind="$KIND_STATE/bin/kind-$KIND_VERSION"
if [[ ! -x $kind ]]; then
	log "building kind $KIND_VERSION from the module proxy"
	mkdir -p "$KIND_STATE/bin"
	GOBIN="$KIND_STATE/bin/.kind" CGO_ENABLED=0 go install "sigs.k8s.io/kind@$KIND_VERSION"
	mv -f "$KIND_STATE/bin/.kind/kind" "$kind"
fi
# kind runs `docker`: Debian's 20.10 client, talking to the project's engine.
export PATH="$(dirname "$DOCKER"):$PATH" KIND_EXPERIMENTAL_DOCKER_NETWORK="$KIND_NETWORK_NAME"

# Another dockerd's bridge on the same subnet takes the route to the node, and the API server's
# port answers with resets. Linux keeps a daemon's bridge after it stops, and after it is killed
# (its containers' network namespaces stay mounted, so the bridge even stays up): a bridge no
# running dockerd owns is removed; one a running dockerd owns is reported.
own=" $(docker network ls --filter driver=bridge -q | sed 's/^/br-/; s/\(br-.\{12\}\).*/\1/' | tr '\n' ' ') "
for dev in $(ip -o -4 addr show 2>/dev/null | awk -v gw="$KIND_NETWORK_GATEWAY/24" '$4 == gw {print $2}'); do
	[[ $own == *" $dev "* ]] && continue
	owner="$(bridge_owner "$dev")"
	[[ -z $owner ]] || die "$dev holds $KIND_NETWORK_SUBNET and belongs to the running dockerd $owner: stop it"
	log "removing $dev: a bridge on $KIND_NETWORK_SUBNET that no running dockerd owns would take the route to the node"
	ip link delete "$dev" || die "cannot remove $dev (needs root): delete it"
done

if ! docker network inspect "$KIND_NETWORK_NAME" >/dev/null 2>&1; then
	log "creating the Docker network $KIND_NETWORK_NAME on $KIND_NETWORK_SUBNET"
	docker network create --driver bridge --subnet "$KIND_NETWORK_SUBNET" --gateway "$KIND_NETWORK_GATEWAY" \
		-o com.docker.network.bridge.enable_ip_masquerade=false "$KIND_NETWORK_NAME" >/dev/null
fi

node="$KIND_CLUSTER-control-plane"
# node_ready SECONDS waits until the node's API server answers /readyz and the node is Ready.
node_ready() {
	local deadline=$((SECONDS + $1)) kc=(kubectl --kubeconfig /etc/kubernetes/admin.conf)
	while ((SECONDS < deadline)); do
		if docker exec "$node" "${kc[@]}" get --raw /readyz >/dev/null 2>&1 &&
			[[ $(docker exec "$node" "${kc[@]}" get node "$node" \
				-o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]; then
			return 0
		fi
		sleep 2
	done
	return 1
}
node_image_id="$(docker image inspect -f '{{.Id}}' "$KIND_NODE_IMAGE")"
if "$kind" get clusters 2>/dev/null | grep -qx "$KIND_CLUSTER"; then
	running_image="$(docker inspect -f '{{.Image}}' "$node" 2>/dev/null || true)"
	state="$(docker inspect -f '{{.State.Running}}' "$node" 2>/dev/null || true)"
	if [[ $running_image != "$node_image_id" || $state != true ]]; then
		log "the cluster runs another node image (or is stopped): recreating it"
		"$kind" delete cluster --name "$KIND_CLUSTER" >/dev/null 2>&1 || true
	elif ! node_ready 180; then
		# A node restarted with its dockerd (after the machine or the session was killed) usually
		# comes back within a minute; one that does not is recreated rather than debugged.
		log "the cluster's API server or node is not Ready 180 s after its start: recreating it"
		"$kind" delete cluster --name "$KIND_CLUSTER" >/dev/null 2>&1 || true
	fi
fi
if ! "$kind" get clusters 2>/dev/null | grep -qx "$KIND_CLUSTER"; then
	etcd_tag="$(docker image ls --format '{{.Tag}}' a2a-fleet.local/k8s/etcd | head -1)"
	config="$KIND_STATE/cluster-$KIND_CLUSTER.yaml"
	# KIND_ETCD_DIR: etcd's data in a host folder (e.g. on /dev/shm) instead of the node's /var
	# volume, for a benchmark cluster on a host whose disk is short of room.
	etcd_mount=""
	if [[ -n ${KIND_ETCD_DIR:-} ]]; then
		mkdir -p "$KIND_ETCD_DIR"
		etcd_mount="  extraMounts:
  - hostPath: $KIND_ETCD_DIR
    containerPath: /var/lib/etcd"
	fi
	cat >"$config" <<CONFIG
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
networking:
  # The node's bridge conflist (hack/kind/node-image.sh): kindnetd cannot be built offline.
  disableDefaultCNI: true
  podSubnet: $KIND_POD_SUBNET
  serviceSubnet: $KIND_SERVICE_SUBNET
  apiServerAddress: 127.0.0.1
nodes:
- role: control-plane
  image: $KIND_NODE_IMAGE
$etcd_mount
kubeadmConfigPatches:
- |
  kind: ClusterConfiguration
  # The images preloaded into the node, built from source (hack/kind/node-image.sh).
  imageRepository: a2a-fleet.local/k8s
  etcd:
    local:
      imageTag: $etcd_tag
- |
  kind: KubeletConfiguration
  # This VM has cgroup v1, which kubelet 1.37 refuses unless told otherwise.
  failCgroupV1: false
CONFIG
	log "creating the kind cluster $KIND_CLUSTER (~1-2 min)"
	start=$SECONDS
	"$kind" create cluster --name "$KIND_CLUSTER" --config "$config" --kubeconfig "$kubeconfig" --wait 5m ||
		{ "$kind" export logs --name "$KIND_CLUSTER" "$KIND_STATE/logs" >/dev/null 2>&1 || true; die "kind create cluster failed (node logs: $KIND_STATE/logs)"; }
	log "cluster created in $((SECONDS - start)) s"
fi
"$kind" get kubeconfig --name "$KIND_CLUSTER" >"$kubeconfig"

# The project's images and Redis (hack/kind/rootfs.sh, for test/chaos), loaded when this node
# (container) has not been given this build yet.
loaded="$KIND_STATE/loaded/$(docker inspect -f '{{.Id}}' "$node")"
mkdir -p "$loaded"
for image in $(cat "$KIND_STATE/project-images" "$KIND_STATE/redis-image"); do
	want="$(docker image inspect -f '{{.Id}}' "$image")"
	stamp="$loaded/$(tr '/:' '__' <<<"$image")"
	if ! stamp_ok "$stamp" "$want"; then
		log "loading $image into the node"
		"$kind" load docker-image --name "$KIND_CLUSTER" "$image" >/dev/null
		stamp_write "$stamp" "$want"
	fi
done
printf 'KUBECONFIG=%s\n' "$kubeconfig"
