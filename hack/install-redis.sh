#!/usr/bin/env bash
# Installs redis-server from Debian packages for the Redis state-store tests
# in internal/convstore.
#
# Idempotent: does nothing (but stopping a system service) when a
# redis-server binary is already present.
# Non-interactive: safe for CI (runs as root, no stdin).
# The package's auto-started system service is stopped and disabled because
# the tests start their own redis-server processes on free loopback ports
# (no persistence, temp dir) and a system instance on :6379 holding stale keys
# would only confuse people debugging them.
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive

REDIS_SERVER_BIN="${REDIS_SERVER_BIN:-/usr/bin/redis-server}"

have_redis() {
	[[ -x "$REDIS_SERVER_BIN" ]] && "$REDIS_SERVER_BIN" --version >/dev/null 2>&1
}

stop_service() {
	# Best effort: there may be no init system at all (containers, CI).
	if command -v systemctl >/dev/null 2>&1 && systemctl list-unit-files redis-server.service >/dev/null 2>&1; then
		systemctl stop redis-server.service >/dev/null 2>&1 || true
		systemctl disable redis-server.service >/dev/null 2>&1 || true
	fi
	if command -v service >/dev/null 2>&1; then
		service redis-server stop >/dev/null 2>&1 || true
	fi
	# Without an init system the package's postinst may still have started a
	# daemon; stop only the packaged one (its pid file), never test servers.
	if [[ -f /run/redis/redis-server.pid ]]; then
		kill "$(cat /run/redis/redis-server.pid)" >/dev/null 2>&1 || true
	fi
}

if have_redis; then
	echo "redis-server already installed: $("$REDIS_SERVER_BIN" --version)"
	stop_service
	exit 0
fi

if [[ "$(id -u)" -ne 0 ]]; then
	SUDO=sudo
else
	SUDO=
fi

apt_install() {
	$SUDO apt-get install -y -q --no-install-recommends redis-server </dev/null
}

# Only refresh the package lists when the install fails without it: the
# update is the slow part and usually unnecessary on a warm machine.
if ! apt_install; then
	$SUDO apt-get update -q </dev/null
	apt_install
fi

stop_service

if ! have_redis; then
	echo "install-redis: $REDIS_SERVER_BIN is missing or does not run after install" >&2
	exit 1
fi
echo "installed: $("$REDIS_SERVER_BIN" --version)"
