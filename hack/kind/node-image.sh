#!/usr/bin/env bash
# Builds the kind node image without a registry, idempotently: a2a-fleet.local/kind-node:<k8s>.
#
# `kind build node-image` fetches every image its inputs lack, which cannot work offline, so the
# node is assembled here from parts built on this machine:
# - the root filesystem of hack/kind/rootfs.sh (Debian bookworm, systemd, Debian's containerd 1.6,
#   runc and CNI plugins) plus kind v0.33's own base files (entrypoint, systemd units, kubelet
#   drop-ins) from the Go module cache, and the containerd settings this VM needs;
# - kubelet, kubeadm, kubectl and the control plane's images (kube-apiserver,
#   kube-controller-manager, kube-scheduler, kube-proxy, etcd) built from source by
#   hack/build-control-plane.sh --with-node; CoreDNS built from the module proxy; a pause program
#   (hack/kind/pause), all under a2a-fleet.local/k8s/ (kubeadm's imageRepository, set by up.sh);
# - the images preloaded into the node's containerd (namespace k8s.io) with a second containerd
#   run on the host against the node's /var/lib/containerd, as kind preloads them (--no-unpack).
# No default CNI (kindnetd is not served by the module proxy): a bridge conflist of Debian's
# plugins on the node's pod subnet; storage is kind's host-path fallback.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
build_lock
repo="$(cd "$(dirname "$0")/../.." && pwd)"

COREDNS_VERSION="${COREDNS_VERSION:-v1.14.6}"
LOCAL_PATH_VERSION="${LOCAL_PATH_VERSION:-v0.0.30}"
KIND_IMAGE_REPOSITORY="a2a-fleet.local/k8s"
PAUSE_IMAGE="$KIND_IMAGE_REPOSITORY/pause:a2a-fleet"
kind_src="$(GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/kind@$KIND_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
[[ -d $kind_src/images/base/files ]] || die "kind $KIND_VERSION source not found in the module cache"

"$(dirname "$0")/rootfs.sh"
assets="$("$repo/hack/build-control-plane.sh" --with-node --print-assets)"
etcd_version="$("$assets/etcd" --version | sed -n 's/^etcd Version: //p')"

work="$KIND_STATE/node-build"
mkdir -p "$work" "$KIND_STATE/bin"

# module_binary MODULE VERSION OUT: a command whose main package is its module's root, built from
# the module proxy in a throwaway module (so its go.sum is resolved there, not in the project's).
module_binary() {
	local module="$1" version="$2" out="$3" dir
	[[ -x $out ]] && return 0
	log "building $module $version from the module proxy (~1-4 min)"
	dir="$work/build-$(basename "$out")"
	rm -rf "$dir" && mkdir -p "$dir"
	(cd "$dir" && go mod init local.invalid/build >/dev/null 2>&1 &&
		GOFLAGS=-mod=mod go get "$module@$version" >/dev/null 2>&1 &&
		CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$out.tmp" "$module") ||
		die "building $module $version failed"
	mv -f "$out.tmp" "$out"
}
coredns="$KIND_STATE/bin/coredns-$COREDNS_VERSION"
module_binary github.com/coredns/coredns "$COREDNS_VERSION" "$coredns"
# Storage as kind's own default: rancher's local-path-provisioner (volumes are 0777 folders on the
# node, so a non-root pod can write its PVC; the in-tree host-path provisioner makes them 0755 root).
local_path="$KIND_STATE/bin/local-path-provisioner-$LOCAL_PATH_VERSION"
module_binary github.com/rancher/local-path-provisioner "$LOCAL_PATH_VERSION" "$local_path"
pause="$KIND_STATE/bin/pause"
(cd "$repo" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$pause" ./hack/kind/pause)

# The inputs of the node image: if none changed, it is up to date.
inputs="$(
	cat "$KIND_STATE/rootfs/node.stamp" "$KIND_STATE/rootfs/base.stamp"
	sha256sum "$assets"/* "$coredns" "$local_path" "$pause" "$0" "$(dirname "$0")/lib.sh" | cut -c1-64
	echo "$KIND_VERSION $etcd_version"
)"
if image_exists "$KIND_NODE_IMAGE" && stamp_ok "$KIND_STATE/node-image.stamp" "$inputs"; then
	log "$KIND_NODE_IMAGE is up to date"
	exit 0
fi

# --- component images: one layer each, the binary on PATH as the upstream images have it.
# component_image IMAGE DIR [--change ...]
component_image() {
	local image="$1" dir="$2"
	shift 2
	tar --numeric-owner --xattrs --xattrs-include='security.capability' -C "$dir" -c . |
		docker import --change "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" "$@" - "$image" >/dev/null
}
images=()
for component in kube-apiserver kube-controller-manager kube-scheduler; do
	rm -rf "$work/$component" && mkdir -p "$work/$component/usr/local/bin" "$work/$component/tmp"
	cp "$assets/$component" "$work/$component/usr/local/bin/"
	component_image "$KIND_IMAGE_REPOSITORY/$component:$K8S_VERSION" "$work/$component"
	images+=("$KIND_IMAGE_REPOSITORY/$component:$K8S_VERSION")
done
rm -rf "$work/etcd" && mkdir -p "$work/etcd/usr/local/bin" "$work/etcd/tmp" "$work/etcd/var/lib/etcd"
cp "$assets/etcd" "$work/etcd/usr/local/bin/"
component_image "$KIND_IMAGE_REPOSITORY/etcd:$etcd_version-0" "$work/etcd"
images+=("$KIND_IMAGE_REPOSITORY/etcd:$etcd_version-0")
# kube-proxy programs iptables: Debian's, from the node's root filesystem.
rm -rf "$work/kube-proxy" && cp -a "$KIND_STATE/rootfs/node" "$work/kube-proxy"
cp "$assets/kube-proxy" "$work/kube-proxy/usr/local/bin/"
component_image "$KIND_IMAGE_REPOSITORY/kube-proxy:$K8S_VERSION" "$work/kube-proxy"
images+=("$KIND_IMAGE_REPOSITORY/kube-proxy:$K8S_VERSION")
rm -rf "$work/coredns-image" && mkdir -p "$work/coredns-image/etc/ssl/certs" "$work/coredns-image/tmp"
cp "$coredns" "$work/coredns-image/coredns"
# As upstream's image: non-root, allowed to bind :53 by a file capability (kubeadm's Deployment
# adds NET_BIND_SERVICE to the bounding set, which only a file capability makes effective).
command -v setcap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 -q install -y --no-install-recommends libcap2-bin >/dev/null
setcap cap_net_bind_service=+ep "$work/coredns-image/coredns"
cp "$KIND_STATE/rootfs/base/etc/ssl/certs/ca-certificates.crt" "$work/coredns-image/etc/ssl/certs/"
component_image "$KIND_IMAGE_REPOSITORY/coredns:$COREDNS_VERSION" "$work/coredns-image" --change 'ENTRYPOINT ["/coredns"]' --change 'USER 65532:65532'
images+=("$KIND_IMAGE_REPOSITORY/coredns:$COREDNS_VERSION")
rm -rf "$work/local-path" && mkdir -p "$work/local-path/usr/local/bin" "$work/local-path/tmp"
cp "$local_path" "$work/local-path/usr/local/bin/local-path-provisioner"
LOCAL_PATH_IMAGE="$KIND_IMAGE_REPOSITORY/local-path-provisioner:$LOCAL_PATH_VERSION"
component_image "$LOCAL_PATH_IMAGE" "$work/local-path"
images+=("$LOCAL_PATH_IMAGE")
# Its helper pods (mkdir, rm of a volume's folder) run the Debian base image.
images+=("$LOCAL_DEBIAN_IMAGE")
rm -rf "$work/pause" && mkdir -p "$work/pause"
cp "$pause" "$work/pause/pause"
component_image "$PAUSE_IMAGE" "$work/pause" --change 'ENTRYPOINT ["/pause"]' --change 'USER 65535:65535'
images+=("$PAUSE_IMAGE")

# --- the node's root filesystem.
node="$work/node"
log "assembling the node root filesystem"
rm -rf "$node" && cp -a "$KIND_STATE/rootfs/node" "$node"
files="$kind_src/images/base/files"
install -m 0755 "$files"/usr/local/bin/* "$node/usr/local/bin/"
mkdir -p "$node/kind/bin" "$node/etc/kubernetes/manifests" "$node/etc/cni/net.d" "$node/etc/systemd/system/kubelet.service.d"
install -m 0644 "$files"/kind/README.txt "$node/kind/" 2>/dev/null || true
install -m 0755 "$files"/kind/bin/* "$node/kind/bin/"
install -m 0644 "$files"/etc/crictl.yaml "$node/etc/"
install -m 0644 "$files"/etc/default/kubelet "$node/etc/default/"
install -m 0644 "$files"/etc/sysctl.d/* "$node/etc/sysctl.d/"
install -m 0644 "$files"/etc/systemd/system/*.service "$files"/etc/systemd/system/*.slice "$node/etc/systemd/system/"
install -m 0644 "$files"/etc/systemd/system/kubelet.service.d/* "$node/etc/systemd/system/kubelet.service.d/"
# kind's units start /usr/local/bin/containerd; Debian installs it in /usr/bin.
ln -sf /usr/bin/containerd "$node/usr/local/bin/containerd"
rm -f "$node/etc/systemd/system/containerd-fuse-overlayfs.service"
# containerd: kind's settings, minus fuse-overlayfs (not installed), plus what this VM needs:
# restrict_oom_score_adj (a negative oom_score_adj needs CAP_SYS_RESOURCE, which the VM's
# bounding set lacks), the preloaded pause image, Debian's CNI plugin folder.
mkdir -p "$node/etc/containerd"
awk '
	/^\[proxy_plugins/ { skip = 1; next }
	/^\[/ { skip = 0 }
	skip { next }
	/^# fuse-overlayfs/ { next }
	{ print }
' "$files/etc/containerd/config.toml" |
	sed -e 's/restrict_oom_score_adj = false/restrict_oom_score_adj = true/' \
		-e "s#sandbox_image = .*#sandbox_image = \"$PAUSE_IMAGE\"#" >"$node/etc/containerd/config.toml"
cat >>"$node/etc/containerd/config.toml" <<'TOML'

[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "/usr/lib/cni"
  conf_dir = "/etc/cni/net.d"
TOML
# The base runtime spec kind generates with `ctr oci spec` (same containerd version on the host),
# with its product-files hook and without rlimits.
ctr oci spec |
	jq '.hooks.createContainer[.hooks.createContainer|length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' |
	jq 'del(.process.rlimits)' >"$node/etc/containerd/cri-base.json"
# The pod network: one bridge on the node's pod subnet (kube-controller-manager gives the only node
# the first /24 of the pod subnet); services reach pods through kube-proxy's iptables rules, which
# see bridged traffic (bridge-nf-call-iptables, set by kube-proxy).
cat >"$node/etc/cni/net.d/10-a2a-fleet-bridge.conflist" <<CNI
{
  "cniVersion": "1.0.0",
  "name": "a2a-fleet-pods",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$KIND_NODE_POD_SUBNET"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
CNI
# kind's base image clean-up (images/base/Dockerfile): only the units the node needs start.
find "$node/lib/systemd/system/sysinit.target.wants/" -name "systemd-tmpfiles-setup.service" -delete
rm -f "$node"/lib/systemd/system/multi-user.target.wants/* "$node"/etc/systemd/system/*.wants/*
rm -f "$node"/lib/systemd/system/local-fs.target.wants/* "$node"/lib/systemd/system/sockets.target.wants/*udev*
rm -f "$node"/lib/systemd/system/sockets.target.wants/*initctl* "$node"/lib/systemd/system/basic.target.wants/*
echo "ReadKMsg=no" >>"$node/etc/systemd/journald.conf"
mkdir -p "$node/etc/systemd/system/multi-user.target.wants"
for unit in kubelet containerd undo-mount-hacks; do
	ln -sf "/etc/systemd/system/$unit.service" "$node/etc/systemd/system/multi-user.target.wants/$unit.service"
done
ln -sf /dev/null "$node/etc/systemd/system/systemd-binfmt.service"
install -m 0755 "$assets/kubelet" "$assets/kubeadm" "$assets/kubectl" "$node/usr/bin/"
printf '%s' "$K8S_VERSION" >"$node/kind/version"
# kind's own storage manifest (pkg/build/nodeimage/const_storage.go), with the images built here;
# kind applies /kind/manifests/default-storage.yaml when it creates the cluster.
mkdir -p "$node/kind/manifests"
awk '/^const defaultStorageManifest = `/ { on = 1; sub(/^.*= `/, ""); } on && /^`$/ { exit } on { print }' \
	"$kind_src/pkg/build/nodeimage/const_storage.go" |
	sed -e "s#\` + storageProvisionerImage + \`#$LOCAL_PATH_IMAGE#g" -e "s#\` + storageHelperImage + \`#$LOCAL_DEBIAN_IMAGE#g" \
		>"$node/kind/manifests/default-storage.yaml"
grep -q "image: $LOCAL_PATH_IMAGE" "$node/kind/manifests/default-storage.yaml" ||
	die "kind's storage manifest changed shape (pkg/build/nodeimage/const_storage.go)"

# --- preload the images into the node's containerd, with a containerd of the same version run on
# the host against the node's /var/lib/containerd (no privileged build container needed).
log "preloading ${#images[@]} images into the node's containerd"
preload="$work/preload"
rm -rf "$preload" && mkdir -p "$preload"
printf 'version = 2\ndisabled_plugins = ["io.containerd.grpc.v1.cri"]\n' >"$preload/config.toml"
containerd --config "$preload/config.toml" --root "$node/var/lib/containerd" --state "$preload/state" \
	--address "$preload/containerd.sock" >"$preload/containerd.log" 2>&1 &
preload_pid=$!
trap 'kill $preload_pid 2>/dev/null || true' EXIT
for _ in $(seq 100); do [[ -S $preload/containerd.sock ]] && break; sleep 0.1; done
for image in "${images[@]}"; do
	docker save "$image" | ctr --address "$preload/containerd.sock" --namespace k8s.io images import \
		--label=io.cri-containerd.pinned=pinned --no-unpack --digests - >/dev/null ||
		die "preloading $image failed (log: $preload/containerd.log)"
done
ctr --address "$preload/containerd.sock" --namespace k8s.io images list -q >"$work/preloaded.txt"
kill $preload_pid && wait $preload_pid 2>/dev/null || true
trap - EXIT

log "importing $KIND_NODE_IMAGE"
tar --numeric-owner -C "$node" -c . | docker import - "$KIND_NODE_IMAGE-rootfs" >/dev/null
# The image settings of kind's base image; `docker import --change` cannot set STOPSIGNAL (the
# signal that makes systemd shut the node down cleanly), a one-line build on top of it can.
printf 'FROM %s
ENV container=docker
STOPSIGNAL SIGRTMIN+3
ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]
' \
	"$KIND_NODE_IMAGE-rootfs" | docker build -q -t "$KIND_NODE_IMAGE" - >/dev/null
stamp_write "$KIND_STATE/node-image.stamp" "$inputs"
docker image prune -f >/dev/null
log "$KIND_NODE_IMAGE built; preloaded: $(tr '\n' ' ' <"$work/preloaded.txt")"
