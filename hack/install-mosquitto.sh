#!/usr/bin/env bash
# Installs Mosquitto 2.x (broker + clients) from Debian packages for the
# broker tests in internal/brokertest and pkg/a2amqtt, and the command-line
# clients (mosquitto_pub, mosquitto_sub, mosquitto_rr: Debian's
# mosquitto-clients) that the suites and docs use.
#
# Idempotent: does nothing when a 2.x mosquitto and the three clients are
# already installed; installs only what is missing otherwise.
# Non-interactive: safe for CI (runs as root, no stdin).
# The package's auto-started system service is stopped and disabled because
# tests start their own mosquitto processes on free loopback ports and a
# system instance on :1883 would only confuse people debugging them.
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive

MOSQUITTO_BIN="${MOSQUITTO_BIN:-/usr/sbin/mosquitto}"

have_mosquitto2() {
	# `mosquitto -h` exits non-zero but prints "mosquitto version 2.x.y".
	local out
	out="$("$MOSQUITTO_BIN" -h 2>&1 || true)"
	[[ "$out" =~ mosquitto\ version\ 2\. ]]
}

stop_service() {
	# Best effort: there may be no init system at all (containers, CI).
	if command -v systemctl >/dev/null 2>&1 && systemctl list-unit-files mosquitto.service >/dev/null 2>&1; then
		systemctl stop mosquitto.service >/dev/null 2>&1 || true
		systemctl disable mosquitto.service >/dev/null 2>&1 || true
	fi
	if command -v service >/dev/null 2>&1; then
		service mosquitto stop >/dev/null 2>&1 || true
	fi
	# Without an init system the package's postinst may still have started a
	# daemon; stop only the packaged one (its pid file), never other brokers.
	if [[ -f /run/mosquitto/mosquitto.pid ]]; then
		kill "$(cat /run/mosquitto/mosquitto.pid)" >/dev/null 2>&1 || true
	fi
}

CLIENTS=(mosquitto_pub mosquitto_sub mosquitto_rr)

have_clients() {
	local c
	for c in "${CLIENTS[@]}"; do
		command -v "$c" >/dev/null 2>&1 || return 1
	done
}

if have_mosquitto2 && have_clients; then
	echo "mosquitto 2.x already installed: $("$MOSQUITTO_BIN" -h 2>&1 | head -n1); clients: ${CLIENTS[*]}"
	stop_service
	exit 0
fi

if [[ "$(id -u)" -ne 0 ]]; then
	SUDO=sudo
else
	SUDO=
fi

# Only the missing packages: a machine with the broker but without the clients
# (or the other way round) gets just the other package.
PACKAGES=()
have_mosquitto2 || PACKAGES+=(mosquitto)
have_clients || PACKAGES+=(mosquitto-clients)

apt_install() {
	$SUDO apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" </dev/null
}

# Only refresh the package lists when the install fails without it: the
# update is the slow part and usually unnecessary on a warm machine.
if ! apt_install; then
	$SUDO apt-get update -q </dev/null
	apt_install
fi

stop_service

if ! have_mosquitto2; then
	echo "install-mosquitto: $MOSQUITTO_BIN is not Mosquitto 2.x after install" >&2
	"$MOSQUITTO_BIN" -h 2>&1 | head -n1 >&2 || true
	exit 1
fi
if ! have_clients; then
	echo "install-mosquitto: ${CLIENTS[*]} not all on PATH after installing mosquitto-clients" >&2
	exit 1
fi
echo "installed: $("$MOSQUITTO_BIN" -h 2>&1 | head -n1); clients: ${CLIENTS[*]}"
