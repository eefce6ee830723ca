#!/usr/bin/env bash
# `make dev BROKER=mosquitto`: the local stack (cmd/devstack) on a real Mosquitto 2.x with the
# dynamic-security plugin instead of the embedded broker; MOSQUITTO_BACKEND=table uses the
# project's decision-table plugin instead of dynsec (hack/build-mosquitto-table-plugin.sh).
#
#   hack/dev-mosquitto.sh STATE_DIR [devstack flags...]
#
# The broker runs with the configuration the manifests ship (config/mosquitto/dynsec/mosquitto.conf,
# or config/mosquitto/mosquitto.conf for the table: persistence, packet size), with the container's
# paths replaced by STATE_DIR/mosquitto and one listener on 127.0.0.1:${MOSQUITTO_PORT:-1883}.
# dynsec is initialised once with an admin whose random password is kept in
# STATE_DIR/mosquitto/admin-password (mode 0600), so identities and retained cards survive
# restarts like the rest of STATE_DIR. The broker stops with devstack. The operator signs agent
# cards here as on the embedded broker (devstack's --card-signing-secret) and retains the key set
# on $a2a-fleet/v1/card-keys, which every agent's shared role may read: `a2actl agents` verifies.
# Needs KUBEBUILDER_ASSETS (make dev sets it) and Mosquitto (hack/install-mosquitto.sh).
set -euo pipefail

cd "$(dirname "$0")/.."
state="${1:?usage: hack/dev-mosquitto.sh STATE_DIR [devstack flags...]}"
shift
port="${MOSQUITTO_PORT:-1883}"
mosquitto="${MOSQUITTO_BIN:-/usr/sbin/mosquitto}"
# Debian installs the plugin under the multiarch folder.
plugin="${MOSQUITTO_DYNSEC_PLUGIN:-$(ls /usr/lib/*/mosquitto_dynamic_security.so 2>/dev/null | head -n1)}"
for f in "$mosquitto" "${plugin:-/usr/lib/<arch>/mosquitto_dynamic_security.so}"; do
	[[ -e "$f" ]] || { echo "dev-mosquitto: $f not found: run hack/install-mosquitto.sh" >&2; exit 1; }
done
# The sender-stamp plugin the conversation service relies on (built into bin/ by make dev).
sender="$(hack/build-mosquitto-plugin.sh --print-path)"
[[ -e "$sender" ]] || { echo "dev-mosquitto: $sender not found: run hack/build-mosquitto-plugin.sh" >&2; exit 1; }
command -v mosquitto_ctrl >/dev/null || { echo "dev-mosquitto: mosquitto_ctrl not found (package mosquitto-clients): run hack/install-mosquitto.sh" >&2; exit 1; }
backend="${MOSQUITTO_BACKEND:-dynsec}"
case "$backend" in
dynsec) ;;
table)
	table="$(hack/build-mosquitto-table-plugin.sh --print-path)"
	[[ -e "$table" ]] || { echo "dev-mosquitto: $table not found: run hack/build-mosquitto-table-plugin.sh" >&2; exit 1; }
	;;
*) echo "dev-mosquitto: MOSQUITTO_BACKEND must be dynsec or table, not '$backend'" >&2; exit 2 ;;
esac

dir="$(mkdir -p "$state/mosquitto" && cd "$state/mosquitto" && pwd)"
chmod 0700 "$dir"
if [[ "$backend" == table && ! -s "$dir/admin-password" ]]; then
	(umask 077; head -c 24 /dev/urandom | base64 | tr -d '/+=' >"$dir/admin-password")
	echo "dev-mosquitto: decision-table admin password in $dir/admin-password"
fi
if [[ "$backend" == dynsec && ! -s "$dir/dynamic-security.json" ]]; then
	umask 077
	head -c 24 /dev/urandom | base64 | tr -d '/+=' >"$dir/admin-password"
	mosquitto_ctrl dynsec init "$dir/dynamic-security.json" admin "$(cat "$dir/admin-password")" >/dev/null
	echo "dev-mosquitto: initialised dynsec in $dir (admin password in $dir/admin-password)"
fi

# The shipped configuration (config/mosquitto: the table; its component dynsec/: dynsec), with the
# container's paths and listener replaced for this machine.
conf=config/mosquitto/mosquitto.conf
if [[ "$backend" == dynsec ]]; then conf=config/mosquitto/dynsec/mosquitto.conf; fi
mkdir -p "$dir/listeners"
printf 'listener %s 127.0.0.1\n' "$port" >"$dir/listeners/plain.conf"
sed -e "s|/usr/lib/mosquitto_dynamic_security.so|$plugin|" \
	-e "s|/usr/lib/mosquitto_a2a_fleet_sender.so|$sender|" \
	-e "s|/mosquitto/data|$dir|g" \
	-e "s|/mosquitto/listeners|$dir/listeners|g" \
	-e "s|/usr/lib/mosquitto_a2a_fleet_table.so|${table:-}|" \
	-e "s|/mosquitto/admin/password|$dir/admin-password|" \
	"$conf" >"$dir/mosquitto.conf"
# Started as root, Mosquitto would switch to the "mosquitto" user, which cannot read STATE_DIR.
echo "user $(id -un)" >>"$dir/mosquitto.conf"

# A broker an earlier run left behind (that run was killed before its EXIT trap): stop it.
if [[ -s "$dir/mosquitto.pid" ]]; then
	old="$(cat "$dir/mosquitto.pid")"
	if [[ "$(tr '\0' ' ' <"/proc/$old/cmdline" 2>/dev/null)" == *"$dir/mosquitto.conf"* ]]; then
		echo "dev-mosquitto: a Mosquitto (pid $old) of an earlier run on $dir is still running: stopping it"
		kill "$old" 2>/dev/null || true
		for _ in $(seq 50); do kill -0 "$old" 2>/dev/null || break; sleep 0.1; done
		kill -9 "$old" 2>/dev/null || true
	fi
	rm -f "$dir/mosquitto.pid"
fi
if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
	echo "dev-mosquitto: 127.0.0.1:$port is already in use; set MOSQUITTO_PORT" >&2
	exit 1
fi
# In its own session, so a Ctrl-C reaches only the stack: the broker stays up while the agents and
# the service close their connections (offline cards), and the EXIT trap stops it after them.
setsid "$mosquitto" -c "$dir/mosquitto.conf" >"$dir/mosquitto.log" 2>&1 &
broker=$!
echo "$broker" >"$dir/mosquitto.pid"
trap 'kill "$broker" 2>/dev/null; wait "$broker" 2>/dev/null || true; rm -f "$dir/mosquitto.pid"' EXIT
for _ in $(seq 100); do
	(exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
	kill -0 "$broker" 2>/dev/null || { echo "dev-mosquitto: mosquitto exited:" >&2; cat "$dir/mosquitto.log" >&2; exit 1; }
	sleep 0.1
done
echo "dev-mosquitto: Mosquitto $("$mosquitto" -h 2>&1 | head -n1 | awk '{print $3}') with $backend on mqtt://127.0.0.1:$port (log: $dir/mosquitto.log)"

# A built binary (make dev builds it) rather than `go run`, which exits 1 when Ctrl-C reaches it.
[[ -x bin/devstack ]] || go build -o bin/devstack ./cmd/devstack
# Not exec: the EXIT trap stops the broker after the stack. A Ctrl-C reaches this script too, and
# bash then ends with the stack's own status (0 after a clean stop), not with the signal's.
MOSQUITTO_ADMIN_PASSWORD="$(cat "$dir/admin-password")" bin/devstack --state-dir "$state" \
	--mosquitto-url "mqtt://127.0.0.1:$port" --mosquitto-admin admin --mosquitto-backend "$backend" "$@"
