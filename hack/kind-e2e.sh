#!/usr/bin/env bash
# End-to-end on a kind cluster (machines with a Docker engine; the project's CI has none, so
# there the same suite runs against the local envtest control plane: `make test`).
#
# 1. creates a kind cluster (KIND_CLUSTER, default a2a-fleet-e2e),
# 2. builds the operator and conversation-service images and loads them into it,
# 3. deploys config/default and config/conversation-service and waits for the rollouts to be
#    created (the pods need a broker at A2A_BROKER to become Ready; that is not what this checks),
# 4. scales both Deployments to zero, because the e2e suite runs its own operator and service
#    in-process against its own loopback brokers (Mosquitto with dynsec and the embedded broker)
#    and two operators must not reconcile the same Agents,
# 5. runs `go test ./test/e2e/` with E2E_USE_EXISTING_CLUSTER=1 and KUBECONFIG pointing at kind.
set -euo pipefail

cd "$(dirname "$0")/.."
CLUSTER="${KIND_CLUSTER:-a2a-fleet-e2e}"
KIND="${KIND:-kind}"
KUBECTL="${KUBECTL:-kubectl}"
KUSTOMIZE="${KUSTOMIZE:-bin/kustomize-v5.8.1}"
OPERATOR_IMG="${OPERATOR_IMG:-a2a-fleet/operator:e2e}"
SERVICE_IMG="${SERVICE_IMG:-a2a-fleet/conversation-service:e2e}"

for tool in docker "$KIND" "$KUBECTL" go; do
	command -v "$tool" >/dev/null || { echo "kind-e2e: $tool not found" >&2; exit 1; }
done
docker info >/dev/null 2>&1 || { echo "kind-e2e: no Docker engine reachable" >&2; exit 1; }

if ! "$KIND" get clusters | grep -qx "$CLUSTER"; then
	"$KIND" create cluster --name "$CLUSTER" --wait 120s
fi
export KUBECONFIG="$(mktemp)"
trap 'rm -f "$KUBECONFIG"' EXIT
"$KIND" get kubeconfig --name "$CLUSTER" >"$KUBECONFIG"

docker build -t "$OPERATOR_IMG" .
# The repository Dockerfile builds the manager only; the service image reuses its recipe.
docker build -t "$SERVICE_IMG" -f - . <<'DOCKERFILE'
FROM golang:1.26 AS build
WORKDIR /src
ENV CGO_ENABLED=0 GOTOOLCHAIN=local
COPY go.mod go.sum ./
RUN go mod download
COPY api/ api/
COPY cmd/ cmd/
COPY controllers/ controllers/
COPY internal/ internal/
COPY pkg/ pkg/
RUN go build -trimpath -ldflags="-s -w" -o /out/conversation-service ./cmd/conversation-service
FROM gcr.io/distroless/static:nonroot
COPY --from=build /out/conversation-service /conversation-service
USER 65532:65532
ENTRYPOINT ["/conversation-service"]
DOCKERFILE
"$KIND" load docker-image --name "$CLUSTER" "$OPERATOR_IMG" "$SERVICE_IMG"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp" "$KUBECONFIG"' EXIT
"$KUSTOMIZE" build config/default | sed "s|image: controller:latest|image: $OPERATOR_IMG|" >"$tmp/operator.yaml"
"$KUSTOMIZE" build config/conversation-service | sed "s|image: conversation-service:latest|image: $SERVICE_IMG|" >"$tmp/service.yaml"
"$KUBECTL" apply --server-side -f "$tmp/operator.yaml"
"$KUBECTL" apply --server-side -f "$tmp/service.yaml"
"$KUBECTL" -n a2a-fleet-system get deploy
"$KUBECTL" -n a2a-fleet-system scale deploy --all --replicas=0

E2E_USE_EXISTING_CLUSTER=1 go test ./test/e2e/ -count=1 -timeout 10m -v "$@"
