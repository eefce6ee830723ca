# Shared settings of the hack/kind scripts (sourced, not run).
#
# Everything they build or start lives outside the clone, in A2A_FLEET_CACHE (default
# ~/.cache/a2a-fleet), so a fresh clone on a machine that built it before reuses the Docker data
# root (images, the node image) and the built binaries, as the Go build cache is reused.

A2A_FLEET_CACHE="${A2A_FLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/a2a-fleet}"
KIND_STATE="$A2A_FLEET_CACHE/kind"
DOCKER_STATE="$A2A_FLEET_CACHE/docker"
# The project's own Docker engine: its own socket, data root and exec root, so it never touches
# a Docker the machine may already run.
export DOCKER_HOST="${A2A_FLEET_DOCKER_HOST:-unix://$DOCKER_STATE/docker.sock}"
# Debian's docker.io client (20.10): it builds with the engine's own BuildKit, no buildx plugin.
DOCKER="${DOCKER:-/usr/bin/docker}"
export DOCKER_BUILDKIT=1

# The one reserved, non-private range every network here uses (RFC 2544 benchmarking,
# 198.18.0.0/15): the Docker network the kind node sits on, the pod subnet and the service subnet.
KIND_NETWORK_NAME="${KIND_NETWORK_NAME:-a2a-fleet-kind}"
KIND_NETWORK_SUBNET="198.18.0.0/24"
KIND_NETWORK_GATEWAY="198.18.0.1"
KIND_POD_SUBNET="198.18.128.0/17"
KIND_NODE_POD_SUBNET="198.18.128.0/24"
KIND_SERVICE_SUBNET="198.19.0.0/16"
KIND_CLUSTER="${KIND_CLUSTER:-a2a-fleet}"
# One kubeconfig per cluster name (two clusters may run side by side, e.g. for two worktrees).
KIND_KUBECONFIG="$KIND_STATE/$KIND_CLUSTER.kubeconfig"

KIND_VERSION="${KIND_VERSION:-v0.33.0}"
K8S_VERSION="${K8S_VERSION:-v1.37.2}"
K8S_VERSION="v${K8S_VERSION#v}"
DEBIAN_SUITE=bookworm

# Names of the locally made images. The project's own images keep the names the manifests use.
LOCAL_DEBIAN_IMAGE="a2a-fleet.local/debian:$DEBIAN_SUITE"
LOCAL_STATIC_IMAGE="a2a-fleet.local/static:nonroot"
LOCAL_GO_IMAGE="a2a-fleet.local/golang:$(go env GOVERSION | sed 's/^go//')"
KIND_NODE_IMAGE="a2a-fleet.local/kind-node:$K8S_VERSION"

log() { printf '[%s] %s\n' "$(basename "$0" .sh)" "$*" >&2; }
die() {
	log "ERROR: $*"
	exit 1
}
docker() { "$DOCKER" "$@"; }

# image_exists NAME: the engine has an image of that name.
image_exists() { docker image inspect "$1" >/dev/null 2>&1; }

# stamp_ok FILE CONTENT / stamp_write FILE CONTENT: a build records what it was built from, so a
# rerun with the same inputs does nothing.
stamp_ok() { [[ -f $1 && "$(cat "$1")" == "$2" ]]; }
stamp_write() { mkdir -p "$(dirname "$1")" && printf '%s' "$2" >"$1"; }

# build_lock: serialise the builds of the shared cache (two clones or worktrees running kind-up at
# once); the second waits, then finds everything up to date.
build_lock() {
	[[ -n ${A2A_KIND_BUILD_LOCKED:-} ]] && return 0 # a parent script holds it
	mkdir -p "$KIND_STATE"
	exec 8>"$KIND_STATE/.build.lock"
	flock 8
	export A2A_KIND_BUILD_LOCKED=1
}

# bridge_owner DEV prints "pid (host)" of the running dockerd that owns the bridge DEV
# (br-<network id>), nothing when no running dockerd does (it was stopped or killed).
bridge_owner() {
	local dev="$1" pid host ids
	[[ $dev == br-* ]] || { printf 'unknown (%s is not a Docker bridge)' "$dev"; return; }
	for pid in $(pgrep -x dockerd || true); do
		host="$(tr '\0' '\n' </proc/"$pid"/cmdline 2>/dev/null |
			awk 'f {print; exit} /^(-H|--host)$/ {f=1} /^--host=/ {sub(/^--host=/, ""); print; exit}')"
		host="${host:-unix:///var/run/docker.sock}"
		# A daemon that does not answer may own it: say so rather than take its bridge.
		ids="$(DOCKER_HOST="$host" timeout 10 docker network ls --no-trunc -q 2>/dev/null)" ||
			{ printf '%s (%s, not answering)' "$pid" "$host"; return; }
		if grep -q "^${dev#br-}" <<<"$ids"; then
			printf '%s (%s)' "$pid" "$host"
			return
		fi
	done
}
