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
HELM_VERSION ?= v3.22.0
GOCYCLO_VERSION ?= v0.6.0
CONTROLLER_GEN := $(LOCALBIN)/controller-gen-$(CONTROLLER_TOOLS_VERSION)
KUSTOMIZE := $(LOCALBIN)/kustomize-$(KUSTOMIZE_VERSION)
STATICCHECK := $(LOCALBIN)/staticcheck-$(STATICCHECK_VERSION)
HELM := $(LOCALBIN)/helm-$(HELM_VERSION)
GOCYCLO := $(LOCALBIN)/gocyclo-$(GOCYCLO_VERSION)
# verify-complexity: functions of non-test code allowed above cyclomatic complexity 30 (docs/development.md).
MAX_COMPLEX_FUNCS ?= 5
# The images of the Dockerfile's two targets (manager, conversation-service), as the manifests
# (config/manager, config/conversation-service) and the chart name them.
IMG ?= a2a-fleet/operator:dev
SERVICE_IMG ?= a2a-fleet/conversation-service:dev
EXAMPLES_IMG ?= a2a-fleet/example-agents:dev
MOSQUITTO_IMG ?= a2a-fleet/mosquitto:dev
DECISION_IMG ?= a2a-fleet/decision-service:dev
# The HTTP gateway (config/gateway, the chart's gateway.enabled; off by default).
GATEWAY_IMG ?= a2a-fleet/gateway:dev
# Kubernetes version the chart is rendered for in verify (the control plane the tests run).
CHART_KUBE_VERSION ?= 1.37.2
# Broker of `make dev`: embedded (mochi-mqtt in the devstack process) or mosquitto (a local
# Mosquitto with dynsec, started by hack/dev-mosquitto.sh).
BROKER ?= embedded
# Where `make dev` keeps its state, and extra devstack flags (test/docs runs it on free ports).
DEV_STATE ?= bin/dev
DEV_FLAGS ?=
# What `make dev` runs, and test/docs runs the docs' commands with: built only when a Go source
# changed, so a `make dev` right after a build starts at once.
DEV_BINS := $(LOCALBIN)/devstack $(LOCALBIN)/a2actl $(LOCALBIN)/foreground
# Programs the tests run as they are (examples/agents' SIGTERM test runs examples/echo, test/e2e
# the conversation service as a process; cmd/devstack's tests run bin/devstack; internal/version's
# test asks each binary its --version; test/cluster runs bin/httpdeploy in a pod): built before the tests, never inside a test's deadline.
TEST_BINS := $(LOCALBIN)/echo $(LOCALBIN)/conversation-service $(LOCALBIN)/manager $(LOCALBIN)/httpdeploy
GO_SOURCES := $(shell find . -name '*.go' -not -path './bin/*' 2>/dev/null) go.mod go.sum VERSION
# The suites that install on the kind cluster: they run after the others, one at a time.
CLUSTER_SUITES := test/cluster test/chaos
MODULE := github.com/a2a-fleet/a2a-fleet
# The release version (the one source: VERSION) and the source commit, stamped into every binary
# (internal/version: --version, `a2actl version`, a2a_fleet_build_info) and the images' labels.
# A clone without .git reports the commit "unknown".
VERSION := $(shell cat VERSION)
COMMIT := $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
LDFLAGS := -X $(MODULE)/internal/version.Version=$(VERSION) -X $(MODULE)/internal/version.Commit=$(COMMIT)
# bin/.commit changes when HEAD does, so the binaries built from GO_SOURCES are relinked with the
# new commit (a commit that changes no Go file still changes what they must report).
COMMIT_STAMP := $(LOCALBIN)/.commit
$(shell mkdir -p $(LOCALBIN); [ "$$(cat $(COMMIT_STAMP) 2>/dev/null)" = "$(COMMIT)" ] || echo "$(COMMIT)" > $(COMMIT_STAMP))
# Generous ceiling for the whole suite; it takes a few minutes (docs/development.md).
TEST_TIMEOUT ?= 25m

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  %-18s %s\n", $$1, $$2 } /^##@/ { printf "\n%s\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Quick start

.PHONY: dev
dev: control-plane $(DEV_BINS) ## Local stack: control plane, CRDs, MQTT broker (BROKER=embedded|mosquitto), operator, conversation service, samples + example agents, and bin/a2actl (Ctrl-C stops, exit 0; state in bin/dev).
	@# hack/foreground hands the terminal to the stack, so that Ctrl-C reaches it and not make,
	@# which would die by the signal (exit 130) however cleanly the stack stops.
ifeq ($(BROKER),embedded)
	KUBEBUILDER_ASSETS="$$(hack/build-control-plane.sh --print-assets)" $(LOCALBIN)/foreground $(LOCALBIN)/devstack --state-dir $(DEV_STATE) $(DEV_FLAGS)
else ifeq ($(BROKER),mosquitto)
	@hack/install-mosquitto.sh >/dev/null
	@hack/build-mosquitto-plugin.sh >/dev/null
	@# MOSQUITTO_BACKEND=table: the decision-table plugin instead of dynsec (hack/dev-mosquitto.sh).
	@if [ "$(MOSQUITTO_BACKEND)" = table ]; then hack/build-mosquitto-table-plugin.sh >/dev/null; fi
	KUBEBUILDER_ASSETS="$$(hack/build-control-plane.sh --print-assets)" $(LOCALBIN)/foreground hack/dev-mosquitto.sh $(DEV_STATE) $(DEV_FLAGS)
else
	@echo "BROKER must be embedded or mosquitto, not '$(BROKER)'"; exit 2
endif

.PHONY: test
test: verify tools-test kind-up release kind-load-release kind-load-previous-release ## Every check and test: verify, the release bundle (test/release checks it) and the previous release's (the upgrade test), then unit, envtest, broker, e2e, docs, the kind cluster (test/cluster) and chaos (test/chaos) suites.
	@mkdir -p $(LOCALBIN)
	@# -v so that the suites' evidence lines (which apiserver, how many broker decisions) show; the
	@# summary keeps the log readable, and a failure prints the whole output of the run. The suites
	@# that install on the kind cluster (CLUSTER_SUITES) share it, so they run one after the other,
	@# after the rest, from the release bundle: its images loaded into kind (kind-load-release), its
	@# a2actl, and its packaged chart for TestHelmChartOnARealCluster (A2A_FLEET_DIST); the
	@# previous release's bundle and tree for TestUpgradeFromThePreviousRelease (A2A_FLEET_PREVIOUS_RELEASE).
	@rc=0; export KUBEBUILDER_ASSETS="$$(hack/build-control-plane.sh --print-assets)" E2E_CLUSTER_KUBECONFIG="$(KIND_KUBECONFIG)"; \
		go test $$(go list ./... | grep -v -x -F $(foreach s,$(CLUSTER_SUITES),-e $(MODULE)/$(s))) -count=1 -timeout $(TEST_TIMEOUT) -v > $(LOCALBIN)/test.log 2>&1 || rc=$$?; \
		A2A_FLEET_DIST=$(CURDIR)/dist A2A_FLEET_PREVIOUS_RELEASE=$(PREVIOUS_RELEASE) A2ACTL=$(CURDIR)/dist/a2actl-$(VERSION)-linux-amd64 go test -p 1 $(addprefix ./,$(CLUSTER_SUITES)) -count=1 -timeout $(TEST_TIMEOUT) -v >> $(LOCALBIN)/test.log 2>&1 || rc=$$?; \
	if [ $$rc -ne 0 ]; then grep -v -E '^=== (RUN|PAUSE|CONT|NAME)' $(LOCALBIN)/test.log; fi; \
	grep -E '^(ok|FAIL|panic:)|envtest: kube-apiserver|^cluster: kube-apiserver|ACL matrix:|chaos result:|^\s*--- (FAIL|SKIP)' $(LOCALBIN)/test.log || true; \
	echo "$$(grep -c -E '^\s*--- PASS' $(LOCALBIN)/test.log) passed, $$(grep -c -E '^\s*--- FAIL' $(LOCALBIN)/test.log) failed, $$(grep -c -E '^\s*--- SKIP' $(LOCALBIN)/test.log) skipped"; \
	exit $$rc

.PHONY: test-cluster
test-cluster: tools-test kind-up kind-load-previous-release ## The kind suite only (test/cluster): quickstart, chart and the upgrade from the previous release on a real kubelet, from the project's images.
	KUBEBUILDER_ASSETS="$$(hack/build-control-plane.sh --print-assets)" E2E_CLUSTER_KUBECONFIG="$(KIND_KUBECONFIG)" A2A_FLEET_PREVIOUS_RELEASE=$(PREVIOUS_RELEASE) \
		go test ./test/cluster/ -count=1 -timeout 20m -v

.PHONY: dashboard-screenshot
dashboard-screenshot: tools-test kind-up ## docs/img/dashboard.png: a real Prometheus records the kind suite's quickstart run, hack/dashboard-render draws the Grafana dashboard's panels from it, headless Chromium screenshots the page (not in make test).
	KUBEBUILDER_ASSETS="$$(hack/build-control-plane.sh --print-assets)" E2E_CLUSTER_KUBECONFIG="$(KIND_KUBECONFIG)" \
		hack/dashboard-render/screenshot.sh

.PHONY: test-chaos
test-chaos: tools-test kind-up ## Chaos suite only (test/chaos, docs/reliability.md), on the kind cluster.
	KUBEBUILDER_ASSETS="$$(hack/build-control-plane.sh --print-assets)" E2E_CLUSTER_KUBECONFIG="$(KIND_KUBECONFIG)" \
		go test ./test/chaos/ -count=1 -timeout 20m -v

.PHONY: test-e2e
test-e2e: tools-test ## The kind suite (test/cluster) against the cluster in KUBECONFIG, which must run the images the manifests name (or IMG, SERVICE_IMG, EXAMPLES_IMG, MOSQUITTO_IMG); hack/kind-e2e.sh on a machine with a registry.
	@# Without the upgrade test: the previous release's images (make previous-release) are loaded
	@# into kind only, not pushed to a registry.
	KUBEBUILDER_ASSETS="$$(hack/build-control-plane.sh --print-assets)" E2E_CLUSTER_KUBECONFIG="$${KUBECONFIG:-$$HOME/.kube/config}" \
		go test ./test/cluster/ -skip TestUpgradeFromThePreviousRelease -count=1 -timeout 20m -v

##@ kind, offline (docs/development.md "A real cluster")

# Where hack/kind keeps the Docker data root, the node image's parts and the kubeconfig: outside
# the clone, so a fresh clone reuses them.
A2A_FLEET_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/a2a-fleet
export A2A_FLEET_CACHE
# The kind cluster's name (hack/kind/up.sh); its kubeconfig is written next to the cache.
KIND_CLUSTER ?= a2a-fleet
export KIND_CLUSTER
KIND_KUBECONFIG := $(A2A_FLEET_CACHE)/kind/$(KIND_CLUSTER).kubeconfig

.PHONY: kind-up
kind-up: control-plane ## A one-node kind cluster with the project's images, offline: dockerd, node image, images from the Dockerfile (idempotent, cached in A2A_FLEET_CACHE).
	hack/kind/up.sh

.PHONY: kind-down
kind-down: ## Delete the kind cluster and stop the project's dockerd (the cache stays).
	hack/kind/down.sh

.PHONY: docker-images
docker-images: ## The images from the Dockerfile with the project's dockerd and locally made base images (hack/kind/images.sh).
	hack/kind/images.sh

##@ Development

.PHONY: manifests
manifests: $(CONTROLLER_GEN) ## Generate the CRDs and RBAC role from the kubebuilder markers, and the chart's copies of them.
	$(CONTROLLER_GEN) rbac:roleName=manager-role crd paths=./api/... paths=./controllers/... \
		output:crd:artifacts:config=config/crd/bases output:rbac:artifacts:config=config/rbac
	hack/sync-chart.sh

.PHONY: generate
generate: $(CONTROLLER_GEN) ## Generate the deepcopy methods.
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./api/...

.PHONY: verify
verify: verify-generated fmt-check vet lint verify-mod verify-kustomize verify-chart verify-version verify-architecture verify-complexity verify-methods ## Static checks that CI runs before the tests.

.PHONY: verify-version
verify-version: ## Fail when the chart's version or appVersion is not the VERSION file's, or CHANGELOG.md has no entry for it ([Unreleased] for a pre-release such as 0.2.0-dev).
	@for key in version appVersion; do \
		v="$$(sed -n "s/^$$key: *\"\{0,1\}\([^\"]*\)\"\{0,1\} *$$/\1/p" charts/a2a-fleet/Chart.yaml)"; \
		if [ "$$v" != "$(VERSION)" ]; then echo "charts/a2a-fleet/Chart.yaml $$key is '$$v', VERSION is '$(VERSION)': make them agree"; exit 1; fi; done
	@# A pre-release (SemVer's -suffix: the working tree between releases) is the [Unreleased] entry.
	@entry='## [$(VERSION)]'; case '$(VERSION)' in *-*) entry='## [Unreleased]';; esac; \
		grep -q -F "$$entry" CHANGELOG.md || { echo "CHANGELOG.md has no '$$entry' entry (VERSION $(VERSION))"; exit 1; }
	@grep -q -F '## [$(shell sed -n 's/^version=//p' hack/previous-release)]' CHANGELOG.md || { echo "CHANGELOG.md has no entry for hack/previous-release's version"; exit 1; }

.PHONY: verify-generated
verify-generated: manifests generate ## Fail when generated files differ from what is committed.
	@if [ -n "$$(git status --porcelain -- api config charts)" ]; then \
		echo "Generated files are out of date; run 'make manifests generate' and commit:"; \
		git status --porcelain -- api config charts; git --no-pager diff --stat -- api config charts; exit 1; fi

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

.PHONY: verify-architecture
verify-architecture: ## Fail when docs/architecture.md's package diagram differs from the import graph (go list), or imports do not run one way.
	go run ./hack/archgraph -check docs/architecture.md

.PHONY: verify-methods
verify-methods: ## Fail when a type of the conversation service or the controllers reaches more than 20 methods, promoted ones included (hack/methodcount).
	go run ./hack/methodcount -max 20 ./internal/convservice/... ./internal/ownership/... ./controllers/...

.PHONY: verify-complexity
verify-complexity: $(GOCYCLO) ## Fail when more than MAX_COMPLEX_FUNCS functions of non-test code have a cyclomatic complexity above 30 (gocyclo, pinned).
	@out="$$($(GOCYCLO) -over 30 -ignore '_test|^bin/' . || true)"; n=$$(printf '%s' "$$out" | grep -c . || true); \
	printf '%s\n' "$$out"; echo "gocyclo -over 30: $$n functions (at most $(MAX_COMPLEX_FUNCS))"; \
	if [ "$$n" -gt $(MAX_COMPLEX_FUNCS) ]; then echo "split the new one into named steps"; exit 1; fi

.PHONY: verify-kustomize
verify-kustomize: $(KUSTOMIZE) ## Render every install overlay (default, quickstart, its TLS, dynsec, ephemeral and decision-service components, mosquitto, conversation-service and its Sentinel component, decision-service, gateway, monitoring).
	@for dir in config/default config/quickstart config/mosquitto config/conversation-service config/decision-service config/monitoring config/admission config/gateway; do \
		$(KUSTOMIZE) build $$dir > /dev/null || { echo "kustomize build $$dir failed"; exit 1; }; done
	@# A component is rendered through an overlay that uses it, as a user's would.
	@tmp=$(LOCALBIN)/.verify-quickstart-tls; mkdir -p $$tmp; \
		printf 'resources: [../../config/quickstart]\ncomponents: [../../config/quickstart/tls]\n' > $$tmp/kustomization.yaml; \
		$(KUSTOMIZE) build $$tmp > /dev/null || { echo "kustomize build of config/quickstart + config/quickstart/tls failed"; exit 1; }
	@tmp=$(LOCALBIN)/.verify-quickstart-sentinel; mkdir -p $$tmp; \
		printf 'resources: [../../config/quickstart]\ncomponents: [../../config/conversation-service/sentinel]\n' > $$tmp/kustomization.yaml; \
		$(KUSTOMIZE) build $$tmp > /dev/null || { echo "kustomize build of config/quickstart + config/conversation-service/sentinel failed"; exit 1; }
	@tmp=$(LOCALBIN)/.verify-quickstart-decision; mkdir -p $$tmp; \
		printf 'resources: [../../config/quickstart]\ncomponents: [../../config/quickstart/decision-service]\n' > $$tmp/kustomization.yaml; \
		$(KUSTOMIZE) build $$tmp > /dev/null || { echo "kustomize build of config/quickstart + config/quickstart/decision-service failed"; exit 1; }
	@tmp=$(LOCALBIN)/.verify-quickstart-dynsec; mkdir -p $$tmp; \
		printf 'resources: [../../config/quickstart]\ncomponents: [../../config/mosquitto/dynsec]\n' > $$tmp/kustomization.yaml; \
		$(KUSTOMIZE) build $$tmp > /dev/null || { echo "kustomize build of config/quickstart + config/mosquitto/dynsec failed"; exit 1; }
	@tmp=$(LOCALBIN)/.verify-quickstart-ephemeral; mkdir -p $$tmp; \
		printf 'resources: [../../config/quickstart]\ncomponents: [../../config/conversation-service/ephemeral]\n' > $$tmp/kustomization.yaml; \
		$(KUSTOMIZE) build $$tmp > /dev/null || { echo "kustomize build of config/quickstart + config/conversation-service/ephemeral failed"; exit 1; }
	@tmp=$(LOCALBIN)/.verify-quickstart-hardened; mkdir -p $$tmp; \
		printf 'resources: [../../config/quickstart]\ncomponents: [../../config/quickstart/tls-everywhere, ../../config/networkpolicy]\n' > $$tmp/kustomization.yaml; \
		$(KUSTOMIZE) build $$tmp > /dev/null || { echo "kustomize build of config/quickstart + config/quickstart/tls-everywhere + config/networkpolicy failed"; exit 1; }

.PHONY: verify-chart
verify-chart: $(HELM) ## helm lint (strict) and helm template of charts/a2a-fleet, with the defaults and with every option on.
	$(HELM) lint --strict charts/a2a-fleet --kube-version $(CHART_KUBE_VERSION)
	$(HELM) lint --strict charts/a2a-fleet --kube-version $(CHART_KUBE_VERSION) $(CHART_ALL_OPTIONS)
	$(HELM) template a2a-fleet charts/a2a-fleet --namespace a2a-fleet-system --kube-version $(CHART_KUBE_VERSION) > /dev/null
	$(HELM) template a2a-fleet charts/a2a-fleet --namespace a2a-fleet-system --kube-version $(CHART_KUBE_VERSION) $(CHART_ALL_OPTIONS) > /dev/null

CHART_ALL_OPTIONS := --set broker.backend=dynsec,mosquitto.tls.enabled=true,broker.tls.caSecret=a2a-fleet-mosquitto-tls,broker.tls.clientCertificate=true \
	--set conversationService.persistence.enabled=true,tracing.otlpEndpoint=http://otel-collector:4318 \
	--set conversationService.replicas=2,conversationService.redis.sentinel.addresses={s0:26379\,s1:26379\,s2:26379},conversationService.redis.passwordSecret.name=redis-auth \
	--set controllerManager.brokerResyncPeriod=5m,controllerManager.brokerReadinessGrace=1m,controllerManager.maxConcurrentReconciles=16,conversationService.callerRate=50,conversationService.callerBurst=100,controllerManager.workloadSecurityFloor=restricted,mosquitto.extraConfig=connection_messages\ false \
	--set metrics.podMonitor.enabled=true,metrics.podMonitor.labels.release=prometheus,gateway.enabled=true \
	--set tls.everywhere=true,networkPolicy.enabled=true,networkPolicy.brokerExtraFrom[0].ipBlock.cidr=198.18.0.0/15 \
	--set decisionService.enabled=true,decisionService.replicas=3,decisionService.cacheMaxAge=30s

.PHONY: control-plane
control-plane: ## Build kube-apiserver, etcd and kubectl from source into bin/k8s (cached).
	hack/build-control-plane.sh

.PHONY: mosquitto
mosquitto: ## Install Mosquitto 2.x from Debian packages (idempotent).
	hack/install-mosquitto.sh

.PHONY: mosquitto-plugin
mosquitto-plugin: ## Build the project's Mosquitto plugins (hack/mosquitto-plugin: the sender stamp, and the decision table in Go) into bin/mosquitto, against Debian's mosquitto-dev (idempotent).
	hack/build-mosquitto-plugin.sh
	hack/build-mosquitto-table-plugin.sh

.PHONY: mosquitto-httpauth-plugin
mosquitto-httpauth-plugin: ## Build the HTTP-auth Mosquitto plugin (go-auth's HTTP protocol and cache) that calls the decision service in the tests, into bin/mosquitto (idempotent).
	hack/build-mosquitto-httpauth-plugin.sh

.PHONY: redis
redis: ## Install redis-server and redis-sentinel from Debian packages (idempotent).
	hack/install-redis.sh

.PHONY: node-deps
node-deps: ## Install the pinned npm packages of the JS interop tests into bin/node-deps (idempotent).
	hack/install-node-deps.sh

.PHONY: tools-test
tools-test: control-plane mosquitto mosquitto-plugin mosquitto-httpauth-plugin redis node-deps $(DEV_BINS) $(TEST_BINS) $(KUSTOMIZE) $(HELM) ## Everything the tests need (kustomize and helm: the kind suites apply the quickstart and install the chart; the npm packages of test/interop).

.PHONY: build
build: ## Build the binaries into bin/ (manager, conversation-service, decision-service, a2actl, devstack).
	go build -ldflags "$(LDFLAGS)" -o $(LOCALBIN)/ ./cmd/manager ./cmd/conversation-service ./cmd/decision-service ./cmd/a2actl ./cmd/devstack

$(DEV_BINS) &: $(GO_SOURCES) $(COMMIT_STAMP)
	@mkdir -p $(LOCALBIN)
	go build -ldflags "$(LDFLAGS)" -o $(LOCALBIN)/ ./cmd/devstack ./cmd/a2actl ./hack/foreground

$(TEST_BINS) &: $(GO_SOURCES) $(COMMIT_STAMP)
	@mkdir -p $(LOCALBIN)
	go build -ldflags "$(LDFLAGS)" -o $(LOCALBIN)/ ./examples/echo ./cmd/conversation-service ./cmd/manager ./test/cluster/httpdeploy

.PHONY: docker-build
docker-build: ## Build the images from the Dockerfile with your Docker engine and registry: IMG, SERVICE_IMG, EXAMPLES_IMG, MOSQUITTO_IMG, DECISION_IMG, GATEWAY_IMG.
	docker build $(DOCKER_BUILD_ARGS) --target manager -t $(IMG) .
	docker build $(DOCKER_BUILD_ARGS) --target conversation-service -t $(SERVICE_IMG) .
	docker build $(DOCKER_BUILD_ARGS) --target example-agents -t $(EXAMPLES_IMG) .
	docker build $(DOCKER_BUILD_ARGS) --target mosquitto -t $(MOSQUITTO_IMG) .
	docker build $(DOCKER_BUILD_ARGS) --target decision-service -t $(DECISION_IMG) .
	docker build $(DOCKER_BUILD_ARGS) --target gateway -t $(GATEWAY_IMG) .

# The images' version label and their binaries' stamp: the Dockerfile reads VERSION itself; the
# commit comes from here (the build context has no .git).
DOCKER_BUILD_ARGS := --build-arg VERSION=$(VERSION) --build-arg COMMIT=$(COMMIT)

# make release saves the six images (IMAGES=0: without them, an incomplete bundle).
IMAGES ?= 1
.PHONY: release
release: $(HELM) $(if $(filter 1,$(IMAGES)),docker-images) ## Release bundle of VERSION in dist/: the chart packaged, the six images (docker save | gzip, from the project's dockerd), a2actl for linux/darwin on amd64/arm64, a CycloneDX SBOM, SHA256SUMS; test/release checks it.
	HELM=$(HELM) IMAGES=$(IMAGES) IMG=$(IMG) SERVICE_IMG=$(SERVICE_IMG) EXAMPLES_IMG=$(EXAMPLES_IMG) MOSQUITTO_IMG=$(MOSQUITTO_IMG) hack/release.sh

.PHONY: kind-load-release
kind-load-release: ## Load the release bundle's images (dist/images, make release) into the kind cluster with kind load image-archive, as the bundle's user would.
	hack/release-kind-load.sh

# The previous release's bundle and kustomize tree (hack/previous-release.sh), which the upgrade
# test installs and upgrades to the working tree from.
PREVIOUS_RELEASE := $(shell hack/previous-release.sh --print)

.PHONY: previous-release
previous-release: $(HELM) ## Build the previous release's bundle (hack/previous-release) once, from its commit, into A2A_FLEET_CACHE/releases/ (skipped when there); its images are tagged with its version.
	@HELM=$(HELM) hack/previous-release.sh >/dev/null

.PHONY: kind-load-previous-release
kind-load-previous-release: previous-release ## Load the previous release's images (tagged with its version) into the kind cluster, for the upgrade test.
	DIST=$(PREVIOUS_RELEASE)/dist hack/release-kind-load.sh

.PHONY: deploy
deploy: $(KUSTOMIZE) ## Install config/quickstart (operator, conversation service, Mosquitto) with IMG and SERVICE_IMG into the cluster in KUBECONFIG.
	cd config/manager && $(KUSTOMIZE) edit set image controller=$(IMG)
	cd config/conversation-service && $(KUSTOMIZE) edit set image conversation-service=$(SERVICE_IMG)
	$(KUSTOMIZE) build config/quickstart | kubectl apply --server-side -f -

.PHONY: undeploy
undeploy: $(KUSTOMIZE) ## Remove what deploy installed (the broker's volume too).
	$(KUSTOMIZE) build config/quickstart | kubectl delete --ignore-not-found -f -

##@ Tools (pinned, built from source into bin/)

$(CONTROLLER_GEN):
	GOBIN=$(LOCALBIN) go install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_TOOLS_VERSION)
	mv $(LOCALBIN)/controller-gen $@

$(STATICCHECK):
	GOBIN=$(LOCALBIN) go install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	mv $(LOCALBIN)/staticcheck $@

$(GOCYCLO):
	GOBIN=$(LOCALBIN) go install github.com/fzipp/gocyclo/cmd/gocyclo@$(GOCYCLO_VERSION)
	mv $(LOCALBIN)/gocyclo $@

$(KUSTOMIZE):
	GOBIN=$(LOCALBIN) go install sigs.k8s.io/kustomize/kustomize/v5@$(KUSTOMIZE_VERSION)
	mv $(LOCALBIN)/kustomize $@

$(HELM):
	GOBIN=$(LOCALBIN) go install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)
	mv $(LOCALBIN)/helm $@

.PHONY: tools
tools: $(CONTROLLER_GEN) $(KUSTOMIZE) $(STATICCHECK) $(HELM) $(GOCYCLO) ## Build the pinned tools (controller-gen, kustomize, staticcheck, helm, gocyclo) into bin/.

##@ Benchmarks (docs/benchmarks.md: each records ratios against a baseline of the same run and the load average)

# bench-fleet sizes, comma-separated: FLEET_SIZES on the embedded broker, MOSQUITTO_FLEET_SIZES
# on Mosquitto + dynsec. Empty: the benchmark's own defaults (embedded 1000,3000,10000; Mosquitto
# 1000,3000), which take about an hour on 2 cores; e.g. FLEET_SIZES=1000 MOSQUITTO_FLEET_SIZES=1000.
FLEET_SIZES ?=
MOSQUITTO_FLEET_SIZES ?=
TABLE_FLEET_SIZES ?=
BENCH_FLEET_TIMEOUT ?= 180m
# bench-sdk iterations per benchmark.
SDK_BENCHTIME ?= 1000x

.PHONY: bench
bench: bench-sdk bench-broker bench-service bench-fleet ## Every benchmark below, one after the other (hours with the default fleet sizes).

.PHONY: bench-fleet
bench-fleet: tools-test ## Registration: a fleet of Agents to Ready, operator on the embedded broker (FLEET_SIZES), on Mosquitto + dynsec (MOSQUITTO_FLEET_SIZES) and on Mosquitto + the decision table (TABLE_FLEET_SIZES).
	FLEET_SIZES="$(FLEET_SIZES)" MOSQUITTO_FLEET_SIZES="$(MOSQUITTO_FLEET_SIZES)" TABLE_FLEET_SIZES="$(TABLE_FLEET_SIZES)" \
		KUBEBUILDER_ASSETS="$$(hack/build-control-plane.sh --print-assets)" \
		go test ./test/registration/ -run '^$$' -bench 'BenchmarkFleetRegistration' -benchtime 1x -timeout $(BENCH_FLEET_TIMEOUT)

.PHONY: bench-fleet-kind
bench-fleet-kind: tools-test kind-up release kind-load-release ## The fleet on the installed product on kind (KIND_CLUSTER): quickstart from the release images, 1 000 and 10 000 Agents, per-change broker cost, broker pod deleted under 1 000 clients, latency (FLEETKIND_* knobs: hack/bench-fleet-kind.sh).
	A2ACTL=$(CURDIR)/dist/a2actl-$(VERSION)-linux-amd64 hack/bench-fleet-kind.sh

.PHONY: bench-sdk
bench-sdk: mosquitto ## SDK: SendMessage, streaming and the three inputs over loopback Mosquitto (SDK_BENCHTIME iterations).
	go test ./pkg/a2amqtt/ -run '^$$' -bench . -benchtime $(SDK_BENCHTIME) -timeout 60m

.PHONY: bench-broker
bench-broker: mosquitto mosquitto-plugin ## Broker backends: dynsec message cost by clients, the decision table's change cost by clients, ACL sync of a shared group, embedded authentication, applying agents.
	go test ./internal/mqtt/dynsec/ -run '^$$' -bench MessageCostByClients -benchtime 1x -timeout 60m
	go test ./internal/mqtt/mosqtable/ -run '^$$' -bench ChangeCostByClients -benchtime 1x -timeout 60m
	go test ./internal/mqtt/acl/ ./internal/mqtt/embedded/ -run '^$$' -bench . -timeout 30m
	go test ./internal/mqtt/conformance/ -run '^$$' -bench ApplyAgents -benchtime 1x -timeout 30m

.PHONY: bench-service
bench-service: tools-test ## Conversation service: proxy vs direct, replicas on Redis, history modes (test/e2e); the stores' decide, group commit, recovery and history (internal/convstore).
	KUBEBUILDER_ASSETS="$$(hack/build-control-plane.sh --print-assets)" \
		go test ./test/e2e/ -run '^$$' -bench 'BenchmarkProxyVsDirect|BenchmarkReplicas|BenchmarkHistoryModes' -benchtime 1x -timeout 60m
	go test ./internal/convstore/ -run '^$$' -bench 'BenchmarkDecide|BenchmarkGroupCommit' -benchtime 20000x -timeout 30m
	go test ./internal/convstore/ -run '^$$' -bench BenchmarkRecovery -benchtime 2x -timeout 30m
	go test ./internal/convstore/ -run '^$$' -bench BenchmarkHistoryModes -benchtime 1x -timeout 30m

# print-VAR prints a variable's value (hack/kind-e2e.sh reads the image names with it).
print-%:
	@echo $($*)
