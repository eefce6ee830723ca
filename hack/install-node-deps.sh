#!/usr/bin/env bash
# Installs the Node.js packages of the JS interop tests (test/interop: the official A2A JS SDK,
# @a2a-js/sdk, over MQTT.js, npm "mqtt"; npm "jose" and "canonicalize", the independent JOSE and
# JCS implementations that check signed agent cards) into bin/node-deps from the committed, pinned
# test/interop/js/package.json and package-lock.json (npm ci: exact versions, integrity checked).
#
# Idempotent: a stamp (hash of the manifest, the lockfile and the Node major version) skips the
# install when nothing changed, so the test harness calls it on every run. Needs Node.js >= 20
# and npm; with neither on PATH it installs Debian's nodejs/npm (as root) and checks the version.
#
# Usage: hack/install-node-deps.sh [--print-dir]    (A2A_NODE_DEPS overrides the directory)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
src="$root/test/interop/js"
dest="${A2A_NODE_DEPS:-$root/bin/node-deps}"

if [[ "${1:-}" == "--print-dir" ]]; then
	echo "$dest"
	exit 0
fi

log() { echo "install-node-deps: $*" >&2; }

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
	if [[ "$(id -u)" != 0 ]]; then
		log "node and npm are needed (Node.js >= 20); run as root to install Debian's nodejs and npm, or install them"
		exit 1
	fi
	log "installing nodejs and npm from Debian packages"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
fi

major="$(node -p 'process.versions.node.split(".")[0]')"
if ((major < 20)); then
	log "Node.js $(node --version) is too old: @a2a-js/sdk 1.3.0 needs Node.js >= 20"
	exit 1
fi

stamp="$(cat "$src/package.json" "$src/package-lock.json" | sha256sum | cut -d' ' -f1)-node$major"
if [[ -f "$dest/.stamp" && "$(cat "$dest/.stamp")" == "$stamp" && -d "$dest/node_modules/@a2a-js/sdk" && -d "$dest/node_modules/mqtt" && -d "$dest/node_modules/jose" && -d "$dest/node_modules/canonicalize" ]]; then
	log "up to date in $dest"
	exit 0
fi

mkdir -p "$dest"
cp "$src/package.json" "$src/package-lock.json" "$dest/"
log "npm ci in $dest"
# --ignore-scripts: the packages need no install scripts, so none run.
(cd "$dest" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error)
echo "$stamp" >"$dest/.stamp"
log "installed @a2a-js/sdk $(node -p "require('$dest/node_modules/@a2a-js/sdk/package.json').version") mqtt $(node -p "require('$dest/node_modules/mqtt/package.json').version"), jose $(node -p "require('$dest/node_modules/jose/package.json').version") and canonicalize $(node -p "require('$dest/node_modules/canonicalize/package.json').version") in $dest"
