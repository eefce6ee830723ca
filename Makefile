# a2a-fleet: run `make help` for the targets.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

# The machine's own Go; never fetch another toolchain behind the user's back.
export GOTOOLCHAIN := local

LOCALBIN := $(CURDIR)/bin
CONTROLLER_TOOLS_VERSION ?= v0.23.0
KUSTOMIZE_VERSION ?= v5.8.1
STATICCHECK_VERSION ?= v0.8.2
CONTROLLER_GEN := $(LOCALBIN)/controller-gen-$(CONTROLLER_TOOLS_VERSION)
KUSTOMIZE := $(LOCALBIN)/kustomize-$(KUSTOMIZE_VERSION)
STATICCHECK := $(LOCALBIN)/staticcheck-$(STATICCHECK_VERSION)
IMG ?= a2a-fleet/operator:dev
# Generous ceiling for the whole suite; it takes a few minutes (docs/development.md).
TEST_TIMEOUT ?= 25m

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  %-18s %s\n", $$1, $$2 } /^##@/ { printf "\n%s\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Quick start

.PHONY: dev
dev: control-plane ## Run the local stack: control plane + CRDs + operator (Ctrl-C stops it; state in bin/dev).
	KUBEBUILDER_ASSETS="$$(hack/build-control-plane.sh --print-assets)" go run ./cmd/devstack --state-dir bin/dev

.PHONY: test
test: verify tools-test ## Run every check and test: generated files, gofmt, vet, manifests, unit + envtest + broker tests.
	@mkdir -p $(LOCALBIN)
	@# -v so that the suites' evidence lines (which apiserver, how many broker decisions) show; the
	@# summary keeps the log readable, and a failure prints the whole output of the run.
	@rc=0; KUBEBUILDER_ASSETS="$$(hack/build-control-plane.sh --print-assets)" \
		go test ./... -count=1 -timeout $(TEST_TIMEOUT) -v > $(LOCALBIN)/test.log 2>&1 || rc=$$?; \
	if [ $$rc -ne 0 ]; then grep -v -E '^=== (RUN|PAUSE|CONT|NAME)' $(LOCALBIN)/test.log; fi; \
	grep -E '^(ok|FAIL|panic:)|envtest: kube-apiserver|ACL matrix:|^\s*--- (FAIL|SKIP)' $(LOCALBIN)/test.log || true; \
	echo "$$(grep -c -E '^\s*--- PASS' $(LOCALBIN)/test.log) passed, $$(grep -c -E '^\s*--- FAIL' $(LOCALBIN)/test.log) failed, $$(grep -c -E '^\s*--- SKIP' $(LOCALBIN)/test.log) skipped"; \
	exit $$rc

.PHONY: test-e2e
test-e2e: ## End-to-end suite against the cluster in KUBECONFIG (operator, service and broker deployed there, e.g. hack/kind-e2e.sh).
	E2E_USE_EXISTING_CLUSTER=1 go test ./test/e2e/ -count=1 -timeout 15m -v

##@ Development

.PHONY: manifests
manifests: $(CONTROLLER_GEN) ## Generate the CRDs and RBAC role from the kubebuilder markers.
	$(CONTROLLER_GEN) rbac:roleName=manager-role crd paths=./api/... paths=./controllers/... \
		output:crd:artifacts:config=config/crd/bases output:rbac:artifacts:config=config/rbac

.PHONY: generate
generate: $(CONTROLLER_GEN) ## Generate the deepcopy methods.
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./api/...

.PHONY: verify
verify: verify-generated fmt-check vet lint verify-mod verify-kustomize ## Static checks that CI runs before the tests.

.PHONY: verify-generated
verify-generated: manifests generate ## Fail when generated files differ from what is committed.
	@if [ -n "$$(git status --porcelain -- api config)" ]; then \
		echo "Generated files are out of date; run 'make manifests generate' and commit:"; \
		git status --porcelain -- api config; git --no-pager diff --stat -- api config; exit 1; fi

.PHONY: fmt
fmt: ## gofmt every Go file.
	gofmt -w $$(git ls-files '*.go')

.PHONY: fmt-check
fmt-check: ## Fail when a Go file is not gofmt-clean.
	@out="$$(gofmt -l $$(git ls-files '*.go'))"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

.PHONY: vet
vet: ## go vet.
	go vet ./...

.PHONY: lint
lint: $(STATICCHECK) ## staticcheck (pinned, built from the module proxy).
	$(STATICCHECK) ./...

.PHONY: verify-mod
verify-mod: ## Fail when go.mod/go.sum are not tidy.
	@go mod tidy -diff || { echo "go.mod is not tidy: run 'go mod tidy' and commit"; exit 1; }

.PHONY: verify-kustomize
verify-kustomize: $(KUSTOMIZE) ## Render config/default to make sure the install manifests build.
	$(KUSTOMIZE) build config/default > /dev/null

.PHONY: control-plane
control-plane: ## Build kube-apiserver, etcd and kubectl from source into bin/k8s (cached).
	hack/build-control-plane.sh

.PHONY: mosquitto
mosquitto: ## Install Mosquitto 2.x from Debian packages (idempotent).
	hack/install-mosquitto.sh

.PHONY: redis
redis: ## Install redis-server from Debian packages (idempotent).
	hack/install-redis.sh

.PHONY: tools-test
tools-test: control-plane mosquitto redis ## Everything the tests need.

.PHONY: build
build: ## Build the binaries into bin/.
	go build -o $(LOCALBIN)/manager ./cmd/manager

.PHONY: docker-build
docker-build: ## Build the operator image (needs a Docker engine).
	docker build -t $(IMG) .

.PHONY: deploy
deploy: $(KUSTOMIZE) ## Install CRDs, RBAC and the operator into the cluster in KUBECONFIG.
	cd config/manager && $(KUSTOMIZE) edit set image controller=$(IMG)
	$(KUSTOMIZE) build config/default | kubectl apply --server-side -f -

.PHONY: undeploy
undeploy: $(KUSTOMIZE) ## Remove what deploy installed.
	$(KUSTOMIZE) build config/default | kubectl delete --ignore-not-found -f -

##@ Tools (pinned, built from source into bin/)

$(CONTROLLER_GEN):
	GOBIN=$(LOCALBIN) go install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_TOOLS_VERSION)
	mv $(LOCALBIN)/controller-gen $@

$(STATICCHECK):
	GOBIN=$(LOCALBIN) go install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	mv $(LOCALBIN)/staticcheck $@

$(KUSTOMIZE):
	GOBIN=$(LOCALBIN) go install sigs.k8s.io/kustomize/kustomize/v5@$(KUSTOMIZE_VERSION)
	mv $(LOCALBIN)/kustomize $@

##@ Benchmarks (docs/benchmarks.md)

FLEET_AGENTS ?= 1000
.PHONY: bench-fleet
bench-fleet: tools-test ## Registration benchmark: FLEET_AGENTS Agents to Ready on real Mosquitto + dynsec.
	FLEET_AGENTS=$(FLEET_AGENTS) KUBEBUILDER_ASSETS="$$(hack/build-control-plane.sh --print-assets)" \
		go test ./internal/registration/ -run '^$$' -bench 'BenchmarkFleetRegistration' -benchtime 1x -timeout 30m
