#!/usr/bin/env bash
# Builds the a2a-fleet sender-stamp plugin for Mosquitto 2.0 (hack/mosquitto-plugin/, plugin API v5)
# into bin/mosquitto/mosquitto_a2a_fleet_sender.so, against Debian's mosquitto-dev and
# libmosquitto-dev headers (installed here when missing, with a C compiler). The tests' Mosquitto
# (internal/brokertest) and `make dev BROKER=mosquitto` load it; the project's Mosquitto image
# ships the same build at /usr/lib/mosquitto_a2a_fleet_sender.so (config/mosquitto/mosquitto.conf).
#
#   hack/build-mosquitto-plugin.sh               build when the source or flags changed
#   hack/build-mosquitto-plugin.sh --print-path  print the .so's path (nothing is built)
#   OUT=/path/x.so hack/build-mosquitto-plugin.sh  build somewhere else (an image build)
#
# Idempotent: a build stamp (the source's and the flags' sha256) skips an unchanged build.
set -euo pipefail

cd "$(dirname "$0")/.."
src=hack/mosquitto-plugin/a2a_fleet_sender.c
out="${OUT:-$PWD/bin/mosquitto/mosquitto_a2a_fleet_sender.so}"
if [[ "${1:-}" == "--print-path" ]]; then
	echo "$out"
	exit 0
fi

CC="${CC:-cc}"
CFLAGS=(-std=c99 -O2 -g -Wall -Wextra -Werror -fPIC -fvisibility=default -D_GNU_SOURCE)
# No -lmosquitto: the plugin's mosquitto_* symbols are the broker's own (resolved at dlopen).
LDFLAGS=(-shared -Wl,-soname,mosquitto_a2a_fleet_sender.so)

have_headers() {
	[[ -f /usr/include/mosquitto_broker.h && -f /usr/include/mosquitto_plugin.h && -f /usr/include/mosquitto.h && -f /usr/include/mqtt_protocol.h ]]
}
have_cc() {
	command -v "$CC" >/dev/null 2>&1 && [[ -f /usr/include/stdio.h ]]
}

if ! have_headers || ! have_cc; then
	export DEBIAN_FRONTEND=noninteractive
	SUDO=
	[[ "$(id -u)" -ne 0 ]] && SUDO=sudo
	# mosquitto-dev: mosquitto_broker.h, mosquitto_plugin.h; libmosquitto-dev: mosquitto.h,
	# mqtt_protocol.h; gcc and libc6-dev to compile.
	packages=(mosquitto-dev libmosquitto-dev)
	have_cc || packages+=(gcc libc6-dev)
	install() { $SUDO apt-get install -y -q --no-install-recommends "${packages[@]}" </dev/null; }
	# The package lists are refreshed only when the install fails without them.
	if ! install; then
		$SUDO apt-get update -q </dev/null
		install
	fi
	have_headers || { echo "build-mosquitto-plugin: Mosquitto plugin headers missing after installing ${packages[*]}" >&2; exit 1; }
fi

stamp="$out.sha256"
want="$( { sha256sum "$src" /usr/include/mosquitto_broker.h; echo "$CC ${CFLAGS[*]} ${LDFLAGS[*]}"; } | sha256sum | cut -d' ' -f1)"
if [[ -f "$out" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
	echo "mosquitto sender plugin up to date: $out"
	exit 0
fi
mkdir -p "$(dirname "$out")"
tmp="$out.tmp.$$"
trap 'rm -f "$tmp"' EXIT
"$CC" "${CFLAGS[@]}" -o "$tmp" "$src" "${LDFLAGS[@]}"
mv "$tmp" "$out"
echo "$want" >"$stamp"
echo "built mosquitto sender plugin: $out"
