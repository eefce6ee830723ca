#!/usr/bin/env bash
# Builds the a2a-fleet HTTP-auth plugin for Mosquitto 2.0 (hack/mosquitto-plugin/httpauth,
# plugin API v5): a Go c-shared library that asks the decision service (cmd/decision-service)
# at CONNECT and at every ACL check, in mosquitto-go-auth's HTTP backend protocol with go-auth's
# answer cache. The tests use it as the real broker that calls the decision endpoint
# (mosquitto-go-auth itself is not served by the Go module proxy this project reaches).
# Output: bin/mosquitto/mosquitto_a2a_fleet_httpauth.so. Needs Debian's mosquitto-dev headers,
# installed by hack/build-mosquitto-plugin.sh (run first when missing), and cgo with a C compiler.
#
#   hack/build-mosquitto-httpauth-plugin.sh               build when a source or the toolchain changed
#   hack/build-mosquitto-httpauth-plugin.sh --print-path  print the .so's path (nothing is built)
#   OUT=/path/x.so hack/build-mosquitto-httpauth-plugin.sh  build somewhere else
#
# Idempotent: a build stamp (sha256 of every Go and C file the plugin is built from, go.sum,
# the Go version and the broker header) skips an unchanged build.
set -euo pipefail

cd "$(dirname "$0")/.."
pkg=./hack/mosquitto-plugin/httpauth
out="${OUT:-$PWD/bin/mosquitto/mosquitto_a2a_fleet_httpauth.so}"
if [[ "${1:-}" == "--print-path" ]]; then
	echo "$out"
	exit 0
fi

if [[ ! -f /usr/include/mosquitto_broker.h || ! -f /usr/include/mosquitto_plugin.h ]]; then
	# The sender plugin's script installs mosquitto-dev, libmosquitto-dev and a C compiler.
	OUT="$(mktemp -d)/sender.so" hack/build-mosquitto-plugin.sh >/dev/null
fi

export CGO_ENABLED=1
tags=mosquittoplugin
sources="$(go list -tags "$tags" -deps -f '{{if not .Standard}}{{$d := .Dir}}{{range .GoFiles}}{{$d}}/{{.}} {{end}}{{range .CgoFiles}}{{$d}}/{{.}} {{end}}{{range .CFiles}}{{$d}}/{{.}} {{end}}{{end}}' "$pkg" | tr ' ' '\n' | grep "^$PWD/" | sort)"
want="$( { sha256sum $sources go.sum /usr/include/mosquitto_broker.h; go version; } | sha256sum | cut -d' ' -f1)"
stamp="$out.sha256"
if [[ -f "$out" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
	echo "mosquitto httpauth plugin up to date: $out"
	exit 0
fi
mkdir -p "$(dirname "$out")"
tmp="$(dirname "$out")/.build-httpauth.$$.so"
trap 'rm -f "$tmp" "${tmp%.so}.h"' EXIT
go build -tags "$tags" -buildmode=c-shared -trimpath -ldflags='-s -w' -o "$tmp" "$pkg"
mv "$tmp" "$out"
echo "$want" >"$stamp"
echo "built mosquitto httpauth plugin: $out"
