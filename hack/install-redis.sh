#!/usr/bin/env bash
# Installs redis-server and redis-sentinel from Debian packages for the Redis
# state-store tests (internal/convstore, test/e2e: one server, and a primary
# with replicas watched by Sentinel for the failover test).
#
# Idempotent: does nothing (but stopping the system services) when both
# binaries are already present.
# Non-interactive: safe for CI (runs as root, no stdin).
# The packages' auto-started system services are stopped and disabled because
# the tests start their own redis-server and redis-sentinel processes on free
# loopback ports (no persistence, temp dir), and a system instance on
# :6379/:26379 holding stale keys or monitoring a stale master would only
# confuse people debugging them.
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive

REDIS_SERVER_BIN="${REDIS_SERVER_BIN:-/usr/bin/redis-server}"
REDIS_SENTINEL_BIN="${REDIS_SENTINEL_BIN:-/usr/bin/redis-sentinel}"

have() {
	[[ -x "$1" ]] && "$1" --version >/dev/null 2>&1
}

have_all() {
	have "$REDIS_SERVER_BIN" && have "$REDIS_SENTINEL_BIN"
}

stop_services() {
	local svc
	for svc in redis-server redis-sentinel; do
		# Best effort: there may be no init system at all (containers, CI).
		if command -v systemctl >/dev/null 2>&1 && systemctl list-unit-files "$svc.service" >/dev/null 2>&1; then
			systemctl stop "$svc.service" >/dev/null 2>&1 || true
			systemctl disable "$svc.service" >/dev/null 2>&1 || true
		fi
		if command -v service >/dev/null 2>&1; then
			service "$svc" stop >/dev/null 2>&1 || true
		fi
		# Without an init system the package's postinst may still have started a
		# daemon; stop only the packaged one (its pid file), never test servers.
		if [[ -f "/run/redis/$svc.pid" ]]; then
			kill "$(cat "/run/redis/$svc.pid")" >/dev/null 2>&1 || true
		fi
	done
}

if have_all; then
	echo "redis-server and redis-sentinel already installed: $("$REDIS_SERVER_BIN" --version)"
	stop_services
	exit 0
fi

if [[ "$(id -u)" -ne 0 ]]; then
	SUDO=sudo
else
	SUDO=
fi

apt_install() {
	$SUDO apt-get install -y -q --no-install-recommends redis-server redis-sentinel </dev/null
}

# Only refresh the package lists when the install fails without it: the
# update is the slow part and usually unnecessary on a warm machine. apt
# holds a global lock: another install on the machine makes us wait, not fail.
for attempt in 1 2 3 4 5 6; do
	if apt_install; then
		break
	fi
	if [[ $attempt -eq 1 ]]; then
		$SUDO apt-get update -q </dev/null || true
	elif [[ $attempt -eq 6 ]]; then
		echo "install-redis: apt-get install redis-server redis-sentinel failed" >&2
		exit 1
	else
		sleep 10
	fi
done

stop_services

for bin in "$REDIS_SERVER_BIN" "$REDIS_SENTINEL_BIN"; do
	if ! have "$bin"; then
		echo "install-redis: $bin is missing or does not run after install" >&2
		exit 1
	fi
done
echo "installed: $("$REDIS_SERVER_BIN" --version); $REDIS_SENTINEL_BIN"
