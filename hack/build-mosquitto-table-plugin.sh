#!/usr/bin/env bash
# Builds the a2a-fleet decision-table plugin for Mosquitto 2.0 (hack/mosquitto-plugin/table,
# plugin API v5): a Go c-shared library that answers CONNECT and every ACL check from the
# operator's decision table (internal/mqtt/mosqtable) inside the broker. Output:
# bin/mosquitto/mosquitto_a2a_fleet_table.so. Needs Debian's mosquitto-dev headers, installed
# by hack/build-mosquitto-plugin.sh (run first), and cgo with a C compiler.
#
#   hack/build-mosquitto-table-plugin.sh               build when a source or the toolchain changed
#   hack/build-mosquitto-table-plugin.sh --print-path  print the .so's path (nothing is built)
#   OUT=/path/x.so hack/build-mosquitto-table-plugin.sh  build somewhere else (an image build)
#
# Idempotent: a build stamp (sha256 of every Go and C file the plugin is built from, go.sum,
# the Go version and the broker header) skips an unchanged build.
set -euo pipefail

cd "$(dirname "$0")/.."
pkg=./hack/mosquitto-plugin/table
out="${OUT:-$PWD/bin/mosquitto/mosquitto_a2a_fleet_table.so}"
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
# Every file of the module's own packages the plugin links, plus what pins the rest.
sources="$(go list -tags "$tags" -deps -f '{{if not .Standard}}{{$d := .Dir}}{{range .GoFiles}}{{$d}}/{{.}} {{end}}{{range .CgoFiles}}{{$d}}/{{.}} {{end}}{{range .CFiles}}{{$d}}/{{.}} {{end}}{{end}}' "$pkg" | tr ' ' '\n' | grep "^$PWD/" | sort)"
want="$( { sha256sum $sources go.sum /usr/include/mosquitto_broker.h; go version; } | sha256sum | cut -d' ' -f1)"
stamp="$out.sha256"
if [[ -f "$out" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
	echo "mosquitto table plugin up to date: $out"
	exit 0
fi
mkdir -p "$(dirname "$out")"
tmp="$(dirname "$out")/.build-table.$$.so"
trap 'rm -f "$tmp" "${tmp%.so}.h"' EXIT
# -s -w: no symbol table or DWARF (the .so is loaded by the broker, not debugged with Go tools).
go build -tags "$tags" -buildmode=c-shared -trimpath -ldflags='-s -w' -o "$tmp" "$pkg"
mv "$tmp" "$out"
echo "$want" >"$stamp"
echo "built mosquitto table plugin: $out"
