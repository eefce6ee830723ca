#!/usr/bin/env bash
# Installs Prometheus from Debian's package for `make dashboard-screenshot` (hack/dashboard-render:
# a Prometheus on this machine scrapes the operator and the conversation service on kind, then
# the renderer reads its recorded range data). Not needed by `make test`.
#
# Idempotent: does nothing when the binary answers --version. Non-interactive (root, no stdin).
# The package's system service is stopped and disabled: the renderer runs its own Prometheus on a
# loopback port with a temporary data folder, and a system instance on :9090 scraping nothing
# would only confuse.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
PROMETHEUS_BIN="${PROMETHEUS_BIN:-/usr/bin/prometheus}"

if ! { [[ -x "$PROMETHEUS_BIN" ]] && "$PROMETHEUS_BIN" --version >/dev/null 2>&1; }; then
	apt-get update -qq
	# --no-install-recommends: the package recommends the node exporter, not needed here.
	apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
if command -v systemctl >/dev/null 2>&1 && systemctl list-unit-files prometheus.service >/dev/null 2>&1; then
	systemctl stop prometheus.service >/dev/null 2>&1 || true
	systemctl disable prometheus.service >/dev/null 2>&1 || true
fi
if command -v service >/dev/null 2>&1; then
	service prometheus stop >/dev/null 2>&1 || true
fi
"$PROMETHEUS_BIN" --version 2>&1 | head -1
