#!/usr/bin/env bash
# Installs Chromium from Debian's package for `make dashboard-screenshot`, which screenshots the
# dashboard page hack/dashboard-render writes with `chromium --headless --screenshot`. Not needed
# by `make test`.
#
# Idempotent: does nothing when the binary answers --version. Non-interactive (root, no stdin).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
CHROMIUM_BIN="${CHROMIUM_BIN:-/usr/bin/chromium}"

if ! { [[ -x "$CHROMIUM_BIN" ]] && "$CHROMIUM_BIN" --version >/dev/null 2>&1; }; then
	apt-get update -qq
	# Fonts for the page's text: Debian's chromium pulls only a minimal set by default.
	apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
fi
"$CHROMIUM_BIN" --version
