#!/usr/bin/env bash
# End-to-end on a kind cluster, for machines with a Docker engine. The project's CI machines have
# none: there test/deploy runs the same rendered manifests' binaries as processes against the
# locally built control plane (docs/development.md).
#
# 1. creates a kind cluster (KIND_CLUSTER, default a2a-fleet-e2e) unless it exists;
# 2. runs the e2e suite (test/e2e) against it: the suite brings its own operator, service and
#    loopback brokers, so it runs before anything is installed (two operators must not reconcile
#    the same Agents);
# 3. builds both images from the Dockerfile (`make docker-build`, the names the manifests use) and
#    loads them into the cluster;
# 4. installs config/quickstart (operator, conversation service, Mosquitto with dynsec) with
#    server-side apply and waits until all three Deployments are Available: the manifests' pods
#    run, nothing is scaled down;
# 5. applies config/samples, waits until every Agent is Ready, runs the example agents against
#    the in-cluster broker (kubectl port-forward) with the credentials the operator issued, and
#    chats with the confirmation agent through the conversation service with a2actl.
# KEEP_CLUSTER=1 keeps the cluster afterwards (it is deleted only when this script created it).
set -euo pipefail

cd "$(dirname "$0")/.."
CLUSTER="${KIND_CLUSTER:-a2a-fleet-e2e}"
KIND="${KIND:-kind}"
KUBECTL="${KUBECTL:-kubectl}"
KUSTOMIZE="${KUSTOMIZE:-bin/kustomize-v5.8.1}"
IMG="${IMG:-a2a-fleet/operator:dev}"
SERVICE_IMG="${SERVICE_IMG:-a2a-fleet/conversation-service:dev}"
NS=a2a-fleet-system

for tool in docker "$KIND" "$KUBECTL" go make; do
	command -v "$tool" >/dev/null || { echo "kind-e2e: $tool not found" >&2; exit 1; }
done
docker info >/dev/null 2>&1 || { echo "kind-e2e: no Docker engine reachable" >&2; exit 1; }
[[ -x "$KUSTOMIZE" ]] || make "$KUSTOMIZE"
KUSTOMIZE="$(cd "$(dirname "$KUSTOMIZE")" && pwd)/$(basename "$KUSTOMIZE")"

created=0
if ! "$KIND" get clusters | grep -qx "$CLUSTER"; then
	"$KIND" create cluster --name "$CLUSTER" --wait 120s
	created=1
fi
work="$(mktemp -d)"
pids=()
cleanup() {
	for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
	rm -rf "$work"
	if [[ "$created" == 1 && "${KEEP_CLUSTER:-0}" != 1 ]]; then "$KIND" delete cluster --name "$CLUSTER"; fi
}
trap cleanup EXIT
export KUBECONFIG="$work/kubeconfig"
"$KIND" get kubeconfig --name "$CLUSTER" >"$KUBECONFIG"

echo "== e2e suite against kind"
E2E_USE_EXISTING_CLUSTER=1 go test ./test/e2e/ -count=1 -timeout 15m -v "$@"

echo "== images (the Dockerfile's two targets)"
make docker-build IMG="$IMG" SERVICE_IMG="$SERVICE_IMG"
"$KIND" load docker-image --name "$CLUSTER" "$IMG" "$SERVICE_IMG"

echo "== install config/quickstart"
cp -r config "$work/config"
(cd "$work/config/manager" && "$KUSTOMIZE" edit set image "controller=$IMG")
(cd "$work/config/conversation-service" && "$KUSTOMIZE" edit set image "conversation-service=$SERVICE_IMG")
"$KUSTOMIZE" build "$work/config/quickstart" >"$work/quickstart.yaml"
"$KUBECTL" apply --server-side -f "$work/quickstart.yaml"
for d in controller-manager mosquitto conversation-service; do
	"$KUBECTL" -n "$NS" rollout status "deploy/a2a-fleet-$d" --timeout 5m
done

echo "== samples"
"$KUBECTL" apply --server-side -f config/samples/
"$KUBECTL" wait --for=condition=Ready agents --all --timeout 3m
"$KUBECTL" get agents,conversationpolicies

# The broker from the host, for the example agents and a2actl.
port=18830
"$KUBECTL" -n "$NS" port-forward svc/a2a-fleet-mosquitto "$port:1883" >"$work/port-forward.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.2; done
broker="mqtt://127.0.0.1:$port"

secret() { "$KUBECTL" get secret "$1-mqtt-credentials" -o "jsonpath={.data.$2}" | base64 -d; }
go build -o "$work/" ./examples/confirm ./examples/memory ./examples/echo ./cmd/a2actl
field() { "$KUBECTL" get agent "$1" -o "jsonpath={$2}"; }
for agent in echo confirm memory; do
	id="$(field "$agent" .spec.agentID)"
	A2A_BROKER="$broker" A2A_ORG="$(field "$agent" .spec.orgID)" A2A_UNIT="$(field "$agent" .spec.unitID)" \
		A2A_AGENT="${id:-$agent}" A2A_REQUEST_TOPIC="$(field "$agent" .status.topics.delivery)" \
		A2A_USERNAME="$(secret "$agent" username)" A2A_PASSWORD="$(secret "$agent" password)" \
		"$work/$agent" >"$work/$agent.log" 2>&1 &
	pids+=($!)
done

echo "== chat with acme/demo/confirm through the conversation service"
export A2A_BROKER="$broker" A2A_AS=acme/demo/console A2A_USERNAME="$(secret console username)" A2A_PASSWORD="$(secret console password)"
first="$("$work/a2actl" send acme/demo/confirm "rename the staging bucket" --timeout 30s)"
echo "$first"
# "task ID (context ID): input-required", then the agent's question.
read -r task ctx state < <(sed -n 's/^task \([^ ]*\) (context \([^)]*\)): \(.*\)$/\1 \2 \3/p' <<<"$first")
[[ "$state" == input-required ]] || { echo "kind-e2e: expected input-required, got '$state'" >&2; exit 1; }
second="$("$work/a2actl" send acme/demo/confirm "go ahead" --approve --task-id "$task" --context-id "$ctx" --timeout 30s)"
echo "$second"
grep -q '): completed$' <<<"$second" || { echo "kind-e2e: expected the task to complete" >&2; exit 1; }
echo "kind-e2e: ok"
