#!/usr/bin/env bash
# Builds the envtest control plane (kube-apiserver, etcd, kubectl) from source.
#
# Why from source: this project's machines reach no download site except the Go
# module proxy, so setup-envtest's prebuilt tarballs are out of reach. Every
# release of Kubernetes and etcd is a Go module on the proxy, though, so we
# compile the three binaries ourselves with the local Go toolchain.
#
# Result: bin/k8s/<k8s-version>-<os>-<arch>/{kube-apiserver,etcd,kubectl,
# kube-controller-manager,kube-scheduler}, i.e. the folder layout setup-envtest
# uses and KUBEBUILDER_ASSETS expects (envtest runs the first three; make dev
# also runs kube-controller-manager for garbage collection, RBAC aggregation
# and namespace deletion). With --with-node, also kubelet, kubeadm and
# kube-proxy: what a kind node image needs (hack/kind-node-image.sh).
#
# Usage:
#   hack/build-control-plane.sh                 # build if needed, log to stderr,
#                                               # print KUBEBUILDER_ASSETS=<dir>
#   hack/build-control-plane.sh --print-assets  # build if needed, print only <dir>
#                                               #   KUBEBUILDER_ASSETS=$(hack/build-control-plane.sh --print-assets)
#   hack/build-control-plane.sh --with-node     # also kubelet, kubeadm, kube-proxy
#   hack/build-control-plane.sh --force         # rebuild even if up to date
#
# Environment:
#   K8S_VERSION   Kubernetes release to build (default v1.37.2; "1.37.2" works too)
#   ETCD_VERSION  etcd release to build       (default v3.6.16; "3.6.16" works too)
#
# Cost on 2 cores (measured): cold, with empty Go build and module caches,
# 7-10 min (etcd ~1 min, kube-apiserver + kubectl 6-8 min, the upper end when
# the machine is busy); rebuild after deleting bin/k8s with a warm Go build
# cache 10-20 s; up-to-date check 0.1-0.3 s. Output is reproducible: rebuilds
# are byte-identical (-trimpath, buildDate = release commit time).
#
# Idempotent: a binary whose --version already reports the wanted version is
# left alone, so running this before every test run is cheap.
set -euo pipefail

# ---------------------------------------------------------------------------
# Arguments and pinned versions
# ---------------------------------------------------------------------------
print_assets_only=false
force=false
with_node=false
for arg in "$@"; do
  case "$arg" in
    --print-assets) print_assets_only=true ;;
    --force) force=true ;;
    --with-node) with_node=true ;;
    -h | --help)
      sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
      exit 0
      ;;
    *)
      echo "build-control-plane: unknown argument: $arg (try --help)" >&2
      exit 2
      ;;
  esac
done

# Normalise to a leading "v" so both "1.37.2" and "v1.37.2" are accepted.
K8S_VERSION="${K8S_VERSION:-v1.37.2}"
K8S_VERSION="v${K8S_VERSION#v}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
ETCD_VERSION="v${ETCD_VERSION#v}"

if [[ ! $K8S_VERSION =~ ^v1\.([0-9]+)\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]]; then
  echo "build-control-plane: K8S_VERSION must look like v1.37.2, got $K8S_VERSION" >&2
  exit 2
fi
k8s_minor="${BASH_REMATCH[1]}"
# The staging repositories (k8s.io/api, k8s.io/client-go, ...) are tagged
# v0.X.Y for Kubernetes v1.X.Y.
K8S_STAGING_VERSION="v0.${K8S_VERSION#v1.}"

if [[ ! $ETCD_VERSION =~ ^v3\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]]; then
  echo "build-control-plane: ETCD_VERSION must look like v3.6.16, got $ETCD_VERSION" >&2
  exit 2
fi

# ---------------------------------------------------------------------------
# Paths: everything is relative to the repository, never to the caller's cwd.
# ---------------------------------------------------------------------------
script_dir="$(cd -P -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd -P -- "$script_dir/.." && pwd)"

# All chatter goes to stderr; stdout carries only the assets path, so a
# Makefile can capture it with $(...). fd 3 is the original stdout.
exec 3>&1 1>&2

log() { printf '[build-control-plane] %s\n' "$*" >&2; }
die() {
  log "ERROR: $*"
  exit 1
}

command -v go >/dev/null 2>&1 || die "go is not on PATH (need the Go toolchain to build from source)"

# Build for the machine we run on: the binaries are exec'ed by envtest here,
# and we run them ourselves below to check their versions. Named the way
# setup-envtest names its folders (e.g. 1.37.2-linux-amd64).
{ read -r host_os && read -r host_arch; } < <(GOTOOLCHAIN=local go env GOHOSTOS GOHOSTARCH) ||
  die "'go env GOHOSTOS GOHOSTARCH' failed"
assets_dir="$repo_root/bin/k8s/${K8S_VERSION#v}-${host_os}-${host_arch}"
# Throwaway wrapper modules live here (bin/ is build output, never committed).
build_root="$repo_root/bin/.build"

# ---------------------------------------------------------------------------
# Up-to-date checks: ask each binary for its version.
# ---------------------------------------------------------------------------
# Output is captured into a variable before matching (rather than piping into
# grep -q) so an early-closing grep can't SIGPIPE the binary under pipefail.
has_line() { grep -qxF -- "$2" <<<"$1"; }

apiserver_ok() {
  local out
  out="$("$assets_dir/kube-apiserver" --version 2>/dev/null)" || return 1
  has_line "$out" "Kubernetes $K8S_VERSION"
}
kubectl_ok() {
  local out
  # KUBECONFIG=/dev/null: --client never talks to a server, but don't let a
  # broken kubeconfig of the caller make the check fail.
  out="$(KUBECONFIG=/dev/null "$assets_dir/kubectl" version --client 2>/dev/null)" || return 1
  has_line "$out" "Client Version: $K8S_VERSION"
}
etcd_ok() {
  local out
  out="$("$assets_dir/etcd" --version 2>/dev/null)" || return 1
  has_line "$out" "etcd Version: ${ETCD_VERSION#v}"
}

# kube-controller-manager, kube-scheduler, kubelet, kubeadm and kube-proxy
# print "Kubernetes vX.Y.Z" like kube-apiserver; kubeadm prints its own format.
component_ok() {
  local out
  out="$("$assets_dir/$1" --version 2>/dev/null)" || return 1
  has_line "$out" "Kubernetes $K8S_VERSION"
}
kubeadm_ok() {
  local out
  out="$("$assets_dir/kubeadm" version -o short 2>/dev/null)" || return 1
  has_line "$out" "$K8S_VERSION"
}
control_plane_ok() {
  apiserver_ok && kubectl_ok && component_ok kube-controller-manager && component_ok kube-scheduler
}
node_ok() { component_ok kubelet && kubeadm_ok && component_ok kube-proxy; }

need_k8s() { $force || ! control_plane_ok; }
need_node() { $with_node && { $force || ! node_ok; }; }
need_etcd() { $force || ! etcd_ok; }

finish() {
  if $print_assets_only; then
    printf '%s\n' "$assets_dir" >&3
  else
    log "control plane ready: kube-apiserver + kubectl $K8S_VERSION, etcd $ETCD_VERSION"
    printf 'KUBEBUILDER_ASSETS=%s\n' "$assets_dir" >&3
  fi
}

# Fast path: nothing to do, no lock, no go invocation beyond `go env`.
if ! need_k8s && ! need_etcd && ! need_node; then
  finish
  exit 0
fi

mkdir -p "$build_root"

# Serialise concurrent invocations (e.g. parallel make targets): the second
# one waits, then finds the binaries up to date.
if command -v flock >/dev/null 2>&1; then
  exec 9>"$build_root/.lock"
  flock 9
fi

# ---------------------------------------------------------------------------
# Go environment for the wrapper builds.
# ---------------------------------------------------------------------------
# GOTOOLCHAIN=local: never try to download another toolchain (we can't).
# GOFLAGS=-mod=mod: the wrapper modules are generated, with no committed
#   go.sum; let the go command fill go.mod/go.sum from the proxy + checksum db.
#   (This replaces any caller GOFLAGS such as -mod=vendor/readonly, which would
#   break the wrapper.)
# -buildvcs=false: the wrapper sits inside this repo's git tree; stamping this
#   repo's commit into kube-apiserver would be wrong and would force a re-link
#   after every commit.
# GOWORK=off: a go.work at the repo root must not swallow the wrapper modules.
# CGO_ENABLED=0: static binaries, no C toolchain needed (upstream builds
#   kube-apiserver/kubectl/etcd this way too).
export GOTOOLCHAIN=local GOFLAGS="-mod=mod -buildvcs=false" GOWORK=off CGO_ENABLED=0
export GOOS="$host_os" GOARCH="$host_arch"

# go_mod_download MODULE@VERSION VAR_PREFIX: fetches the module source through
# the proxy into the module cache and sets <VAR_PREFIX>_dir (extracted source)
# and <VAR_PREFIX>_info (the proxy's .info file).
go_mod_download() {
  local json dir info err
  # -json reports errors inside the JSON on stdout, so keep it for messages.
  if ! json="$(cd "$build_root" && go mod download -json "$1")"; then
    err="$(sed -n 's/^[[:space:]]*"Error": "\(.*\)",\{0,1\}$/\1/p' <<<"$json")"
    die "cannot fetch $1 through the module proxy: ${err:-$json}"
  fi
  dir="$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p' <<<"$json")"
  info="$(sed -n 's/^[[:space:]]*"Info": "\(.*\)",\{0,1\}$/\1/p' <<<"$json")"
  [[ -n $dir && -f $dir/go.mod && -n $info ]] || die "unexpected 'go mod download -json $1' output: $json"
  printf -v "${2}_dir" '%s' "$dir"
  printf -v "${2}_info" '%s' "$info"
}

# parse_gomod GO.MOD -> one line per directive of interest:
#   go <version> | godebug <key=value> | require <module> <version> |
#   replace <module> <target...>
# `go mod edit -print` canonicalises the file first, so block/single-line forms
# and comments are normalised and a tiny awk parser is enough.
parse_gomod() {
  go mod edit -print "$1" | awk '
    { sub(/\/\/.*/, "") }                       # drop comments
    NF == 0 { next }
    $1 == ")" { blk = ""; next }
    ($1 == "require" || $1 == "replace" || $1 == "godebug") && $2 == "(" { blk = $1; next }
    $1 == "go" && blk == "" { print "go", $2; next }
    $1 == "require" || $1 == "replace" || $1 == "godebug" { d = $1; $1 = ""; print d $0; next }
    blk != "" { print blk, $0 }
  ' | sed 's/[[:space:]]\{1,\}/ /g; s/ $//'
}

# local_replaced_requires GO.MOD -> modules that GO.MOD both requires and
# replaces with a directory of its own repository (e.g. "./staging/src/k8s.io/api"
# or "../api"). Those replace directives are exactly what `go install mod@ver`
# refuses and what a dependent module never sees, so the wrapper must point
# each of them at the published module of the matching release instead.
local_replaced_requires() {
  parse_gomod "$1" | awk '
    $1 == "require" { req[$2] = 1 }
    $1 == "replace" {
      for (i = 3; i <= NF; i++) if ($i == "=>") break
      t = $(i + 1)
      if (t ~ /^(\.\.?\/|\/)/ && (i + 2) > NF) local[$2] = 1
    }
    END { for (m in local) if (m in req) print m }
  ' | LC_ALL=C sort
}

# write_wrapper DIR MODULE VERSION UPSTREAM_GOMOD REPLACEMENT_VERSION
# Generates DIR/go.mod: a module that requires MODULE@VERSION, pins every
# sibling module that upstream replaces locally to REPLACEMENT_VERSION, and
# copies upstream's `go` and `godebug` lines so the binary gets the same
# runtime GODEBUG defaults as an upstream build (where upstream is the main
# module).
write_wrapper() {
  local dir="$1" mod="$2" ver="$3" upstream_gomod="$4" repl_ver="$5"
  local go_line line siblings=() args=()
  mkdir -p "$dir"
  # Start from a fresh go.mod each time so nothing stale survives a version
  # bump; go.sum is kept (extra hashes are harmless and save lookups).
  rm -f "$dir/go.mod"
  go_line="$(parse_gomod "$upstream_gomod" | awk '$1 == "go" { print $2 }')"
  (cd "$dir" && go mod init "local.invalid/control-plane-build/${mod//\//_}" >/dev/null 2>&1) ||
    die "go mod init in $dir failed"
  args+=("-require=$mod@$ver")
  [[ -n $go_line ]] && args+=("-go=$go_line")
  while IFS= read -r line; do
    [[ -n $line ]] && args+=("-godebug=${line#godebug }")
  done < <(parse_gomod "$upstream_gomod" | grep '^godebug ' || true)
  mapfile -t siblings < <(local_replaced_requires "$upstream_gomod")
  ((${#siblings[@]} > 0)) || die "found no locally replaced modules in $upstream_gomod; layout changed?"
  for line in "${siblings[@]}"; do
    args+=("-replace=$line=$line@$repl_ver")
  done
  (cd "$dir" && go mod edit "${args[@]}") || die "go mod edit in $dir failed"
  log "wrapper $dir/go.mod: $mod@$ver, ${#siblings[@]} sibling modules pinned to $repl_ver"
}

# module_time INFO_FILE -> the release's commit time from the proxy's .info
# (e.g. 2026-10-27T12:01:04Z). Used as buildDate: it makes the build
# reproducible, so a re-link with a warm cache is byte-identical.
module_time() {
  local t
  t="$(sed -n 's/.*"Time":"\([^"]*\)".*/\1/p' "$1")"
  if [[ -n $t ]] && date -u -d "$t" +%Y-%m-%dT%H:%M:%SZ >/dev/null 2>&1; then
    date -u -d "$t" +%Y-%m-%dT%H:%M:%SZ
  else
    echo "${t:-1970-01-01T00:00:00Z}"
  fi
}

# install_from STAGE_DIR NAME... : move freshly built binaries into place with
# an atomic rename, so an interrupted build never leaves a half-written binary
# that a later run (or envtest) could pick up.
install_from() {
  local stage="$1" name
  shift
  for name in "$@"; do
    [[ -x $stage/$name ]] || die "build produced no $stage/$name"
    mkdir -p "$assets_dir"
    mv -f "$stage/$name" "$assets_dir/$name"
  done
  rm -rf "$stage"
}

# ---------------------------------------------------------------------------
# kube-apiserver + kubectl
# ---------------------------------------------------------------------------
build_k8s() {
  # Arguments: the k8s.io/kubernetes/cmd/* commands to build, in one `go build`
  # so the shared packages are compiled once and both cores stay busy.
  local work="$build_root/k8s-$K8S_VERSION" build_date stage start cmd pkgs=()
  start=$SECONDS
  log "building $* $K8S_VERSION from source (cold: 6-10 min on 2 cores for the control plane, ~7 more for the node)"
  # k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them
  # with ./staging/src/k8s.io/*; we point them at the published v0.X.Y tags.
  write_wrapper "$work" k8s.io/kubernetes "$K8S_VERSION" "$k8s_src_dir/go.mod" "$K8S_STAGING_VERSION"

  build_date="$(module_time "$k8s_src_info")"
  # Without these -X flags the binaries report v0.0.0-master (version info is
  # normally injected by kubernetes' hack/lib/version.sh). Both copies of the
  # version package are set, as upstream does. gitCommit is blanked: the proxy
  # doesn't tell us the commit, and the default is a literal "$Format:%H$".
  local ldflags="-s -w" pkg
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$K8S_VERSION"
    ldflags+=" -X $pkg.gitMajor=1"
    ldflags+=" -X $pkg.gitMinor=$k8s_minor"
    ldflags+=" -X $pkg.gitTreeState=clean"
    ldflags+=" -X $pkg.gitCommit="
    ldflags+=" -X $pkg.buildDate=$build_date"
  done
  for cmd in "$@"; do pkgs+=("k8s.io/kubernetes/cmd/$cmd"); done

  stage="$work/out"
  rm -rf "$stage" && mkdir -p "$stage"
  # -mod=mod (GOFLAGS above) lets go add the go.sum lines the node's extra
  # dependencies (cadvisor, CRI client, CSI, ...) need to the wrapper module.
  (cd "$work" && go build -trimpath -ldflags "$ldflags" -o "$stage/" "${pkgs[@]}") ||
    die "building $* $K8S_VERSION failed"
  install_from "$stage" "$@"
  log "$* $K8S_VERSION built in $((SECONDS - start))s"
}

# ---------------------------------------------------------------------------
# etcd
# ---------------------------------------------------------------------------
build_etcd() {
  local work="$build_root/etcd-$ETCD_VERSION" stage start
  start=$SECONDS
  log "building etcd $ETCD_VERSION from source (cold: ~1 min on 2 cores)"
  # etcd 3.5+ has its `main` package at the root of go.etcd.io/etcd/server/v3
  # (main.go -> etcdmain.Main). `go install ...@version` refuses it because its
  # go.mod replaces api/client/pkg with ../ directories, hence the wrapper.
  write_wrapper "$work" go.etcd.io/etcd/server/v3 "$ETCD_VERSION" "$etcd_src_dir/go.mod" "$ETCD_VERSION"

  stage="$work/out"
  rm -rf "$stage" && mkdir -p "$stage"
  # etcd's version string is a constant in go.etcd.io/etcd/api/v3/version, so
  # no -X is needed for `etcd --version`; GitSHA stays "Not provided".
  (cd "$work" && go build -trimpath -ldflags "-s -w" -o "$stage/etcd" go.etcd.io/etcd/server/v3) ||
    die "building etcd $ETCD_VERSION failed"
  install_from "$stage" etcd
  etcd_ok || die "built etcd does not report ${ETCD_VERSION#v}"
  log "etcd $ETCD_VERSION built in $((SECONDS - start))s"
}

# Re-check under the lock: another invocation may have built them meanwhile.
want_k8s=false want_etcd=false want_node=false
if need_k8s; then want_k8s=true; else log "the control plane $K8S_VERSION is up to date"; fi
if need_node; then want_node=true; elif $with_node; then log "the node binaries $K8S_VERSION are up to date"; fi
if need_etcd; then want_etcd=true; else log "etcd $ETCD_VERSION is up to date"; fi

# Fetch all sources before compiling anything, so a mistyped version or an
# unreachable proxy fails within seconds rather than after a long compile.
# shellcheck disable=SC2034 # all four are assigned by go_mod_download (printf -v)
k8s_src_dir="" k8s_src_info="" etcd_src_dir="" etcd_src_info=""
if $want_k8s || $want_node; then go_mod_download "k8s.io/kubernetes@$K8S_VERSION" k8s_src; fi
if $want_etcd; then go_mod_download "go.etcd.io/etcd/server/v3@$ETCD_VERSION" etcd_src; fi

if $want_etcd; then build_etcd; fi
if $want_k8s; then
  build_k8s kube-apiserver kubectl kube-controller-manager kube-scheduler
  control_plane_ok || die "the built control plane does not report $K8S_VERSION"
fi
if $want_node; then
  build_k8s kubelet kubeadm kube-proxy
  node_ok || die "the built kubelet, kubeadm or kube-proxy does not report $K8S_VERSION"
fi

finish
