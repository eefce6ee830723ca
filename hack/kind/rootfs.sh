#!/usr/bin/env bash
# Makes, without any registry, the Debian bookworm images the kind node and the project's
# Dockerfile build on, from Debian's own packages (debootstrap), idempotently:
#
#   a2a-fleet.local/debian:bookworm   minbase + ca-certificates, tzdata: Mosquitto's and the
#                                     plugin build's base (Dockerfile DEBIAN_IMAGE)
#   a2a-fleet.local/static:nonroot    what distroless/static holds: CA certificates, tzdata,
#                                     /etc/passwd with nonroot (65532), /tmp (RUNTIME_IMAGE)
#   a2a-fleet.local/golang:<go>       the base plus this machine's own Go toolchain (GO_IMAGE)
#   a2a-fleet.local/redis:bookworm    the base plus redis-server (the chaos suite's Redis)
#
# and the node's root filesystem (systemd, Debian's containerd, runc, CNI plugins, iptables, ...)
# in A2A_FLEET_CACHE/kind/rootfs/node, which hack/kind/node-image.sh turns into the node image.
# Cost (measured, docs/development.md): ~4-5 min the first time; nothing when up to date.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
build_lock

MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SECURITY_MIRROR="${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
rootfs="$KIND_STATE/rootfs"
# Packages of the node, after kind's own base image (kind v0.33 images/base/Dockerfile), with
# Debian's containerd, runc and CNI plugins instead of the ones kind compiles.
NODE_PACKAGES=(systemd systemd-sysv dbus containerd runc containernetworking-plugins
	conntrack iptables nftables iproute2 ethtool util-linux mount kmod libseccomp2 pigz
	e2fsprogs bash ca-certificates curl jq procps socat)
BASE_PACKAGES=(ca-certificates tzdata)

command -v debootstrap >/dev/null || {
	log "installing debootstrap"
	DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 -q install -y --no-install-recommends debootstrap >/dev/null
}

# in_chroot DIR CMD...: runs CMD in DIR with /proc, /dev and the host's resolver, and no service
# started by a package's postinst.
in_chroot() {
	local dir="$1"
	shift
	printf '#!/bin/sh\nexit 101\n' >"$dir/usr/sbin/policy-rc.d"
	chmod +x "$dir/usr/sbin/policy-rc.d"
	cp -L /etc/resolv.conf "$dir/etc/resolv.conf"
	mount -t proc proc "$dir/proc"
	mount --bind /dev "$dir/dev"
	local rc=0
	DEBIAN_FRONTEND=noninteractive LC_ALL=C chroot "$dir" "$@" || rc=$?
	umount "$dir/dev" "$dir/proc"
	rm -f "$dir/usr/sbin/policy-rc.d"
	return $rc
}

apt_install() {
	local dir="$1"
	shift
	in_chroot "$dir" apt-get -q update >/dev/null
	in_chroot "$dir" apt-get -q install -y --no-install-recommends "$@" >/dev/null
	in_chroot "$dir" apt-get clean
	rm -rf "$dir"/var/lib/apt/lists/*
}

# Base root filesystem: debootstrap minbase with the updates and security suites enabled.
base_key="$DEBIAN_SUITE ${BASE_PACKAGES[*]} v1"
if ! stamp_ok "$rootfs/base.stamp" "$base_key"; then
	log "debootstrap $DEBIAN_SUITE (minbase) from $MIRROR (~2-4 min)"
	rm -rf "$rootfs/base.tmp" && mkdir -p "$rootfs"
	debootstrap --variant=minbase "$DEBIAN_SUITE" "$rootfs/base.tmp" "$MIRROR" >"$rootfs/debootstrap.log" 2>&1 ||
		{ tail -20 "$rootfs/debootstrap.log" >&2; die "debootstrap failed (log: $rootfs/debootstrap.log)"; }
	cat >"$rootfs/base.tmp/etc/apt/sources.list" <<SOURCES
deb $MIRROR $DEBIAN_SUITE main
deb $MIRROR $DEBIAN_SUITE-updates main
deb $SECURITY_MIRROR $DEBIAN_SUITE-security main
SOURCES
	apt_install "$rootfs/base.tmp" "${BASE_PACKAGES[@]}"
	in_chroot "$rootfs/base.tmp" apt-get -q upgrade -y >/dev/null
	in_chroot "$rootfs/base.tmp" apt-get clean
	rm -rf "$rootfs/base.tmp"/var/lib/apt/lists/* "$rootfs/base.tmp/etc/resolv.conf"
	rm -rf "$rootfs/base" && mv "$rootfs/base.tmp" "$rootfs/base"
	stamp_write "$rootfs/base.stamp" "$base_key"
	# Images made from an older base are stale.
	rm -f "$rootfs"/*.image-stamp
fi

# import_dir DIR IMAGE [--change ...]: the folder as a one-layer image, unless it is already
# imported from this base.
import_dir() {
	local dir="$1" image="$2"
	shift 2
	local key
	key="$(cat "$rootfs/base.stamp") $image $*"
	local stamp="$rootfs/$(tr '/:' '__' <<<"$image").image-stamp"
	if image_exists "$image" && stamp_ok "$stamp" "$key"; then return 0; fi
	log "importing $image"
	tar --numeric-owner -C "$dir" -c . | docker import "$@" - "$image" >/dev/null
	stamp_write "$stamp" "$key"
}

hostpath="PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
import_dir "$rootfs/base" "$LOCAL_DEBIAN_IMAGE" --change "ENV $hostpath" --change 'CMD ["bash"]'

# distroless/static's content, from the base's files.
static="$rootfs/static"
rm -rf "$static" && mkdir -p "$static/etc/ssl/certs" "$static/usr/share" "$static/tmp" "$static/home/nonroot"
cp "$rootfs/base/etc/ssl/certs/ca-certificates.crt" "$static/etc/ssl/certs/"
cp -a "$rootfs/base/usr/share/zoneinfo" "$static/usr/share/"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$static/etc/passwd"
printf 'root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n' >"$static/etc/group"
chmod 1777 "$static/tmp"
chown 65532:65532 "$static/home/nonroot"
import_dir "$static" "$LOCAL_STATIC_IMAGE" --change "ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"

# The Go image: this machine's Go (the project builds with it; nothing is downloaded) and its
# trust store, so that the build reaches the module proxy the way this machine does (through
# whatever TLS-inspecting egress the machine trusts).
goroot="$(go env GOROOT)"
goimage="$rootfs/golang"
go_key="$(cat "$rootfs/base.stamp") $goroot $(go env GOVERSION) $(sha256sum /etc/ssl/certs/ca-certificates.crt | cut -c1-16)"
if ! stamp_ok "$goimage.stamp" "$go_key"; then
	rm -rf "$goimage" && cp -a "$rootfs/base" "$goimage"
	mkdir -p "$goimage/usr/local" && cp -a "$goroot" "$goimage/usr/local/go"
	cp /etc/ssl/certs/ca-certificates.crt "$goimage/etc/ssl/certs/ca-certificates.crt"
	stamp_write "$goimage.stamp" "$go_key"
	rm -f "$rootfs"/*golang*.image-stamp
fi
import_dir "$goimage" "$LOCAL_GO_IMAGE" --change "ENV GOPROXY=$(go env GOPROXY) GOSUMDB=$(go env GOSUMDB)" --change "ENV PATH=/usr/local/go/bin:/root/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
	--change "ENV GOTOOLCHAIN=local" --change 'CMD ["bash"]'

# Redis: the base plus Debian's redis-server (the chaos suite runs the conversation service on it),
# non-root (nobody) like the project's images. Its name goes to KIND_STATE/redis-image, for up.sh
# to load it and test/chaos to run it. (Named here, not in lib.sh: lib.sh is an input of the node
# image, and Redis is not.)
LOCAL_REDIS_IMAGE="a2a-fleet.local/redis:$DEBIAN_SUITE"
redis="$rootfs/redis"
redis_key="$(cat "$rootfs/base.stamp") redis-server"
if ! stamp_ok "$redis.stamp" "$redis_key"; then
	log "redis root filesystem: redis-server (~30 s)"
	rm -rf "$redis.tmp" && cp -a "$rootfs/base" "$redis.tmp"
	apt_install "$redis.tmp" redis-server
	rm -f "$redis.tmp/etc/resolv.conf"
	rm -rf "$redis" && mv "$redis.tmp" "$redis"
	stamp_write "$redis.stamp" "$redis_key"
	rm -f "$rootfs"/*redis*.image-stamp
fi
import_dir "$redis" "$LOCAL_REDIS_IMAGE" --change "ENV $hostpath" --change 'USER 65534:65534' \
	--change 'ENTRYPOINT ["/usr/bin/redis-server"]' --change 'CMD ["--port", "6379", "--save", "", "--appendonly", "no", "--protected-mode", "no"]'
printf '%s\n' "$LOCAL_REDIS_IMAGE" >"$KIND_STATE/redis-image"

# The node's root filesystem.
node_key="$(cat "$rootfs/base.stamp") ${NODE_PACKAGES[*]}"
if ! stamp_ok "$rootfs/node.stamp" "$node_key"; then
	log "node root filesystem: ${NODE_PACKAGES[*]} (~1-2 min)"
	rm -rf "$rootfs/node.tmp" && cp -a "$rootfs/base" "$rootfs/node.tmp"
	apt_install "$rootfs/node.tmp" "${NODE_PACKAGES[@]}"
	rm -f "$rootfs/node.tmp/etc/resolv.conf"
	rm -rf "$rootfs/node" && mv "$rootfs/node.tmp" "$rootfs/node"
	stamp_write "$rootfs/node.stamp" "$node_key"
fi
log "base images and node root filesystem are up to date"
