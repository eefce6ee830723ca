#!/usr/bin/env bash
# Builds the installed Debian Mosquitto's own source (apt-get source, Debian's patches applied)
# with debug information into bin/mosquitto-debug/mosquitto, for a backtrace with file and line
# of a broker crash (gdb, a core file): Debian ships no debug symbols for it here, and the
# debug archive is not reachable from every machine. Never a prebuilt binary.
#
#   hack/build-mosquitto-debug.sh               build when missing or the version changed
#   hack/build-mosquitto-debug.sh --print-path  print the binary's path (nothing is built)
#
# Then, e.g.: MOSQUITTO_BIN=$(hack/build-mosquitto-debug.sh --print-path) go test ./test/brokerfault
# (internal/brokertest starts $MOSQUITTO_BIN), and `gdb <binary> core` on a core it left.
#
# Needs a deb-src entry for the suite the package came from (apt-cache showsrc mosquitto must
# list the installed version); the script says so and stops when there is none. Installs
# dpkg-dev (apt-get source) and libssl-dev when missing. The build is the broker alone, as
# Debian configures it except websockets, DLT, systemd and c-ares (not needed on loopback),
# exporting its symbols to plugins (-rdynamic) as Debian's does.
set -euo pipefail

cd "$(dirname "$0")/.."
dir="$PWD/bin/mosquitto-debug"
out="$dir/mosquitto"
if [[ "${1:-}" == "--print-path" ]]; then
	echo "$out"
	exit 0
fi

version="$(dpkg-query -W -f='${Version}' mosquitto 2>/dev/null || true)"
if [[ -z "$version" ]]; then
	echo "build-mosquitto-debug: Debian's mosquitto is not installed (hack/install-mosquitto.sh)" >&2
	exit 1
fi
stamp="$out.version"
if [[ -x "$out" && -f "$stamp" && "$(cat "$stamp")" == "$version" ]]; then
	echo "mosquitto debug build up to date: $out ($version)"
	exit 0
fi

SUDO=
[[ "$(id -u)" -ne 0 ]] && SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
need=()
command -v dpkg-source >/dev/null 2>&1 || need+=(dpkg-dev)
[[ -f /usr/include/openssl/ssl.h ]] || need+=(libssl-dev)
command -v cc >/dev/null 2>&1 || need+=(gcc libc6-dev)
if ((${#need[@]})); then
	$SUDO apt-get install -y -q --no-install-recommends "${need[@]}" </dev/null
fi
# (Captured first: grep -q closing the pipe early would fail apt-cache under pipefail.)
sources="$(apt-cache showsrc mosquitto 2>/dev/null || true)"
if ! grep -qxF "Version: $version" <<<"$sources"; then
	echo "build-mosquitto-debug: no source package mosquitto $version: add a deb-src entry for its suite" >&2
	echo "  (e.g. Types: deb-src beside the deb entry in /etc/apt/sources.list.d/, then apt-get update)" >&2
	exit 1
fi

src="$dir/src"
rm -rf "$src"
mkdir -p "$src"
(cd "$src" && apt-get source -q "mosquitto=$version" >/dev/null)
tree="$(find "$src" -mindepth 1 -maxdepth 1 -type d -name 'mosquitto-*' | head -n1)"
make -C "$tree/src" mosquitto WITH_WEBSOCKETS=no WITH_DOCS=no WITH_CJSON=no WITH_SRV=no WITH_ADNS=no \
	WITH_SYSTEMD=no WITH_DLT=no WITH_STRIP=no CFLAGS="-g -O2 -Wall" LDFLAGS="-rdynamic" >"$dir/build.log" 2>&1 ||
	{ tail -n 20 "$dir/build.log" >&2; exit 1; }
cp "$tree/src/mosquitto" "$out"
echo "$version" >"$stamp"
echo "built mosquitto $version with debug information: $out"
