#!/usr/bin/env bash
# The fleet benchmark on the installed product (test/fleetkind, docs/benchmarks.md "The fleet on
# kind"): the quickstart from the images loaded into the kind cluster KIND_CLUSTER (make kind-up,
# make release kind-load-release), Agents to Ready at FLEETKIND_SIZES, the broker's cost per
# change, the broker pod deleted under FLEETKIND_CLIENTS connected clients, request latency at
# fleet size. It reads the containers' cgroups on the kind node through the project's dockerd.
#   hack/bench-fleet-kind.sh    (KIND_CLUSTER=a2a-fleet; FLEETKIND_BACKEND=table|dynsec,
#                                FLEETKIND_SIGNING=on|off, FLEETKIND_SIZES=1000,10000,
#                                FLEETKIND_IDLE_SECONDS=60 (the broker's idle window per batch),
#                                FLEETKIND_RESTARTS=pod,empty-disk (broker restarts in order: the pod
#                                deleted; the pod and its volume's claim deleted),
#                                FLEETKIND_PROFILE_DIR=dir (kube-apiserver's pprof during the last
#                                rollout, perf record of Mosquitto during the last batches), ...)
# Every rollout step also prints the kind node's CPU by cgroup (each pod's containers, kubelet,
# containerd, the rest), adding up to the node's total.
# It applies this tree's config/quickstart: the images loaded must be built from the same tree
# (make bench-fleet-kind builds and loads the release first). It uninstalls any earlier install
# first and leaves its own in place (for a look afterwards).
set -euo pipefail
cd "$(dirname "$0")/.."
source hack/kind/lib.sh
[[ -f $KIND_KUBECONFIG ]] || die "no kubeconfig $KIND_KUBECONFIG: KIND_CLUSTER=$KIND_CLUSTER make kind-up"
version="$(cat VERSION)"
export E2E_CLUSTER_KUBECONFIG="$KIND_KUBECONFIG" DOCKER
export KUBEBUILDER_ASSETS="${KUBEBUILDER_ASSETS:-$(hack/build-control-plane.sh --print-assets)}"
export A2ACTL="${A2ACTL:-$PWD/dist/a2actl-$version-linux-amd64}"
log "cluster $KIND_CLUSTER, load average $(cut -d' ' -f1-3 /proc/loadavg)"
exec go test ./test/fleetkind/ -run '^$' -bench BenchmarkFleetOnKind -benchtime 1x \
	-timeout "${BENCH_FLEET_KIND_TIMEOUT:-180m}" -v
