#!/usr/bin/env bash
# Installs Debian's Docker engine (docker.io 20.10) if missing and starts the project's own dockerd,
# idempotently: its socket, data root and exec root are under A2A_FLEET_CACHE/docker, so it never
# touches another Docker on the machine and its images survive a fresh clone.
#
#   hack/kind/dockerd.sh          # install + start if needed; prints DOCKER_HOST=...
#   hack/kind/dockerd.sh --stop   # stop it
#
# What this machine needs (measured, docs/development.md "kind"):
# - no default bridge and no iptables rules: the engine creates no network on a private range and
#   changes nothing on the host; kind's network is created on 198.18.0.0/24 by hack/kind/up.sh;
# - runc-capfilter as the default runtime: Docker 20.10 gives --privileged containers capabilities
#   the VM's bounding set lacks (CAP_SYS_RESOURCE here), which runc refuses (moby#42906).
set -euo pipefail
source "$(dirname "$0")/lib.sh"

stop=false
[[ ${1:-} == --stop ]] && stop=true

pidfile="$DOCKER_STATE/docker.pid"
if $stop; then
	# dockerd removes its pidfile as it exits: read the pid once.
	pid=$(cat "$pidfile" 2>/dev/null || true)
	# Linux keeps a stopped daemon's bridges, and one on the kind subnet would take the route
	# from another dockerd (another A2A_FLEET_CACHE) to its node: remove them with the daemon.
	bridges=$(docker network ls --filter driver=bridge -q 2>/dev/null | cut -c1-12 || true)
	if [[ -n $pid ]] && kill "$pid" 2>/dev/null; then
		for _ in $(seq 100); do [[ -e /proc/$pid ]] || break; sleep 0.2; done
		for id in $bridges; do
			ip link show "br-$id" >/dev/null 2>&1 && { ip link delete "br-$id" 2>/dev/null || true; }
		done
		log "dockerd stopped"
	fi
	exit 0
fi

if ! [[ -x /usr/sbin/dockerd && -x /usr/bin/docker && -x /usr/sbin/runc ]]; then
	log "installing Debian's docker.io (dockerd, containerd, runc; ~30-65 s)"
	export DEBIAN_FRONTEND=noninteractive
	apt_get() { apt-get -o DPkg::Lock::Timeout=300 -q "$@"; }
	apt_get update >/dev/null
	apt_get install -y --no-install-recommends docker.io >/dev/null
	# The package's own service (on /var/run/docker.sock) is not the one used here.
	if command -v systemctl >/dev/null && systemctl is-system-running >/dev/null 2>&1; then
		systemctl disable --now docker.service docker.socket >/dev/null 2>&1 || true
	fi
fi

# The capability filter, built from this checkout into the cache (dockerd keeps its path).
filter="$DOCKER_STATE/bin/runc-capfilter"
src="$(cd "$(dirname "$0")" && pwd)/runc-capfilter"
sum="$(cat "$src"/*.go | sha256sum | cut -c1-16)"
if ! stamp_ok "$filter.sum" "$sum" || [[ ! -x $filter ]]; then
	mkdir -p "$DOCKER_STATE/bin"
	(cd "$src" && CGO_ENABLED=0 GOTOOLCHAIN=local go build -trimpath -o "$filter.new" .)
	mv -f "$filter.new" "$filter"
	stamp_write "$filter.sum" "$sum"
fi

if docker info >/dev/null 2>&1; then
	printf 'DOCKER_HOST=%s\n' "$DOCKER_HOST"
	exit 0
fi

mkdir -p "$DOCKER_STATE"
# A daemon of an earlier run that died leaves its pid file and socket behind.
rm -f "$pidfile" "$DOCKER_STATE/docker.sock"
# A killed daemon's containerd may outlive it for a moment; the next daemon would wait on it.
cpid=$(cat "$DOCKER_STATE/exec/containerd/containerd.pid" 2>/dev/null || true)
if [[ -n $cpid ]] && grep -q containerd "/proc/$cpid/comm" 2>/dev/null; then
	kill -9 "$cpid" 2>/dev/null || true
	for _ in $(seq 50); do [[ -e /proc/$cpid ]] || break; sleep 0.1; done
fi
# A killed daemon also leaves its containers' network namespaces mounted (and with them their
# veths and its bridge): release them.
if [[ -d $DOCKER_STATE/exec/netns ]]; then
	for ns in "$DOCKER_STATE"/exec/netns/*; do
		mountpoint -q "$ns" 2>/dev/null && umount -l "$ns" 2>/dev/null || true
	done
fi
log "starting dockerd (data root $DOCKER_STATE/data, log $DOCKER_STATE/dockerd.log)"
setsid /usr/sbin/dockerd \
	--host "$DOCKER_HOST" \
	--data-root "$DOCKER_STATE/data" \
	--exec-root "$DOCKER_STATE/exec" \
	--pidfile "$pidfile" \
	--bridge=none --iptables=false --ip6tables=false --ip-forward=false \
	--add-runtime "capfilter=$filter" --default-runtime capfilter \
	>"$DOCKER_STATE/dockerd.log" 2>&1 </dev/null &
for _ in $(seq 150); do
	if docker info >/dev/null 2>&1; then
		log "dockerd is up ($(docker version --format '{{.Server.Version}}'))"
		printf 'DOCKER_HOST=%s\n' "$DOCKER_HOST"
		exit 0
	fi
	sleep 0.2
done
tail -20 "$DOCKER_STATE/dockerd.log" >&2
die "dockerd did not answer within 30 s"
