#!/usr/bin/env bash
# make dashboard-screenshot: records a real run on the kind cluster with a real Prometheus and
# draws config/monitoring/grafana-dashboard.json from what it recorded into docs/img/dashboard.png.
#   1. Prometheus from Debian (hack/install-prometheus.sh) on a loopback port, a temporary data
#      folder, scraping every running pod of a2a-fleet-system with a container port named
#      "metrics" (the operator's replicas, the conversation service) every 5 s, listed by this
#      script into a file Prometheus discovers (Debian builds it without Kubernetes discovery)
#      and read through the API server's pod proxy with the kubeconfig's credentials;
#   2. the workload: by default the kind suite's quickstart test (install, samples, chats, a
#      rotation, an Agent deleted, the operator scaled to 0 and back, pods killed);
#      DASHBOARD_WORKLOAD replaces it;
#   3. hack/dashboard-render runs each panel's PromQL over the recorded range and writes an HTML
#      page (uPlot from hack/dashboard-render/package.json, npm ci into bin/dashboard-deps);
#   4. Debian's Chromium (hack/install-chromium.sh) screenshots it headless.
# Needs the cluster (E2E_CLUSTER_KUBECONFIG) and KUBEBUILDER_ASSETS (kubectl), as make sets them.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
: "${E2E_CLUSTER_KUBECONFIG:?the kubeconfig of the kind cluster (make dashboard-screenshot sets it)}"
: "${KUBEBUILDER_ASSETS:?KUBEBUILDER_ASSETS (kubectl; make dashboard-screenshot sets it)}"
kubectl="$KUBEBUILDER_ASSETS/kubectl"
out="${DASHBOARD_PNG:-docs/img/dashboard.png}"
port="${DASHBOARD_PROMETHEUS_PORT:-19090}"
workload="${DASHBOARD_WORKLOAD:-go test ./test/cluster -run TestQuickstartOnARealCluster -count=1 -timeout 20m}"
log() { echo "dashboard-screenshot: $*" >&2; }

hack/install-prometheus.sh >/dev/null
hack/install-chromium.sh >/dev/null
deps="$root/bin/dashboard-deps"
stamp="$(cat hack/dashboard-render/package.json hack/dashboard-render/package-lock.json | sha256sum | cut -d' ' -f1)"
if [[ ! -f "$deps/.stamp" || "$(cat "$deps/.stamp")" != "$stamp" ]]; then
	mkdir -p "$deps"
	cp hack/dashboard-render/package.json hack/dashboard-render/package-lock.json "$deps/"
	(cd "$deps" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error)
	echo "$stamp" >"$deps/.stamp"
fi

work="$(mktemp -d)"
prometheus_pid=""
targets_pid=""
cleanup() {
	if [[ -n "$targets_pid" ]]; then
		kill "$targets_pid" 2>/dev/null || true
		wait "$targets_pid" 2>/dev/null || true
	fi
	if [[ -n "$prometheus_pid" ]]; then
		kill "$prometheus_pid" 2>/dev/null || true
		wait "$prometheus_pid" 2>/dev/null || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT

# The kubeconfig's API server and credentials as files for Prometheus's scrape TLS.
kubeconfig_field() { "$kubectl" config view --raw --minify --kubeconfig "$E2E_CLUSTER_KUBECONFIG" -o jsonpath="$1"; }
server="$(kubeconfig_field '{.clusters[0].cluster.server}')"
kubeconfig_field '{.clusters[0].cluster.certificate-authority-data}' | base64 -d >"$work/ca.crt"
kubeconfig_field '{.users[0].user.client-certificate-data}' | base64 -d >"$work/client.crt"
kubeconfig_field '{.users[0].user.client-key-data}' | base64 -d >"$work/client.key"
chmod 600 "$work/client.key"
# Debian's Prometheus is built without Kubernetes service discovery: a loop here lists the pods
# every 5 s into a file that Prometheus's file discovery watches, one target per running pod with
# a container port named "metrics", read through the API server's pod proxy.
write_targets() {
	local lines entries="" name app port
	lines="$("$kubectl" --kubeconfig "$E2E_CLUSTER_KUBECONFIG" get pods -n a2a-fleet-system -o jsonpath='{range .items[?(@.status.phase=="Running")]}{.metadata.name}{" "}{.metadata.labels.app\.kubernetes\.io/name}{" "}{.spec.containers[*].ports[?(@.name=="metrics")].containerPort}{"\n"}{end}' 2>/dev/null)" || return 0
	while read -r name app port; do
		[[ -n "$port" ]] || continue
		entries+="${entries:+,}{\"targets\":[\"${server#https://}\"],\"labels\":{\"__metrics_path__\":\"/api/v1/namespaces/a2a-fleet-system/pods/$name:$port/proxy/metrics\",\"instance\":\"$name\",\"pod\":\"$name\",\"app\":\"$app\",\"namespace\":\"a2a-fleet-system\"}}"
	done <<<"$lines"
	echo "[$entries]" >"$work/targets.json.tmp"
	mv "$work/targets.json.tmp" "$work/targets.json"
}
echo '[]' >"$work/targets.json"
cat >"$work/prometheus.yml" <<YAML
global:
  scrape_interval: 5s
  evaluation_interval: 5s
scrape_configs:
- job_name: a2a-fleet
  file_sd_configs:
  - files: ['$work/targets.json']
    refresh_interval: 5s
  scheme: https
  tls_config: {ca_file: $work/ca.crt, cert_file: $work/client.crt, key_file: $work/client.key}
YAML
promtool check config "$work/prometheus.yml" >/dev/null
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/data" \
	--web.listen-address="127.0.0.1:$port" --log.level=warn >"$work/prometheus.log" 2>&1 &
prometheus_pid=$!
for _ in $(seq 1 60); do
	curl -fsS "http://127.0.0.1:$port/-/ready" >/dev/null 2>&1 && break
	sleep 1
done
curl -fsS "http://127.0.0.1:$port/-/ready" >/dev/null || { cat "$work/prometheus.log" >&2; exit 1; }
log "Prometheus on 127.0.0.1:$port scraping a2a-fleet-system through $server; running: $workload"

while true; do
	write_targets
	sleep 5
done &
targets_pid=$!

from="$(date +%s)"
rc=0
E2E_CLUSTER_KUBECONFIG="$E2E_CLUSTER_KUBECONFIG" bash -c "$workload" >"$work/workload.log" 2>&1 || rc=$?
tail -n 5 "$work/workload.log" >&2
if [[ "$rc" != 0 ]]; then
	log "the workload failed ($rc); no screenshot"
	exit "$rc"
fi
sleep 15 # the last scrapes after the workload
to="$(date +%s)"
targets="$(curl -fsS "http://127.0.0.1:$port/api/v1/query?query=count(up==1)" | sed -n 's/.*"value":\[[^,]*,"\([0-9]*\)".*/\1/p')"
log "recorded $((to - from)) s; ${targets:-0} targets up at the end"

go run ./hack/dashboard-render -prometheus "http://127.0.0.1:$port" -from "$from" -to "$to" -step 10s \
	-uplot "$deps/node_modules/uplot/dist" -o "$work/dashboard.html"
mkdir -p "$(dirname "$out")"
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --force-device-scale-factor=1 \
	--window-size=1600,1790 --virtual-time-budget=10000 --screenshot="$root/$out" "file://$work/dashboard.html" 2>"$work/chromium.log" ||
	{ cat "$work/chromium.log" >&2; exit 1; }
log "wrote $out"
