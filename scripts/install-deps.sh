#!/usr/bin/env bash
# Installs what agentbox and its tests need on Debian 12, as root. Idempotent:
# a machine that has everything is left alone in a few seconds.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
log() { printf 'install-deps: %s\n' "$*" >&2; }

if [[ $(id -u) -ne 0 ]]; then
	log "run as root (apt-get, runc and network namespaces need it)"
	exit 1
fi

# Debian packages: the OCI runtime, the template builder, the firewall and
# netlink tools the server drives (iptables: CRIU unlocks with it the network of
# images dumped before it locked with nftables), and the toolchain for the tests.
# busybox-static: a self-contained rootfs for template build tests.
pkgs=(runc mmdebstrap nftables iproute2 jq ca-certificates curl make gcc git iptables busybox-static)
# The code interpreter's tests run real kernels on the host: Debian's
# ipykernel (with the plotting and data stack its tests use), node, R's
# IRkernel and a JDK (the Java kernel is on jshell).
pkgs+=(python3-ipykernel python3-matplotlib python3-pandas python3-numpy r-cran-irkernel default-jdk-headless)
# The dashboard's end-to-end test drives Debian's headless Chromium.
pkgs+=(chromium)
# Node.js 20 or newer for the official e2b SDK (it refuses older engines).
# Debian 12's own nodejs is 18; use the node already on the machine if new enough.
node_major=0
if command -v node >/dev/null; then
	node_major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
fi
if ((node_major < 20)); then
	pkgs+=(nodejs npm)
fi
command -v npm >/dev/null || pkgs+=(npm)
# The real OpenSSH client for `agentbox ssh`'s ProxyCommand test, and an
# sftp-server the test copies into a sandbox for sftp and scp.
pkgs+=(openssh-client openssh-sftp-server)
# The microvm isolation tier: QEMU, and lz4 to unpack the guest kernel.
pkgs+=(qemu-system-x86 lz4 e2fsprogs) # e2fsprogs: mkfs.ext4 and debugfs for the microvm disks

missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
	log "installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
	log "Debian packages present"
fi

if command -v node >/dev/null; then
	node_major=$(node -p 'process.versions.node.split(".")[0]')
	if ((node_major < 20)); then
		log "node $(node --version) is too old for the e2b SDK (needs >= 20.18); install Node.js 20+"
		exit 1
	fi
fi

# Go is not a Debian package here: it is expected at /usr/local/go.
if ! command -v go >/dev/null && [[ ! -x /usr/local/go/bin/go ]]; then
	log "Go is missing: install Go >= 1.26 at /usr/local/go (https://go.dev/dl/)"
	exit 1
fi

# gVisor's runsc for the "gvisor" isolation tier, pinned. It must be a static
# build: runsc re-executes itself inside an empty chroot, where a dynamic
# binary finds no ld.so ("cannot read client sync file ... EOF"). The Go
# proxy refuses branch queries for gvisor.dev, hence the pseudo-version.
runsc_version=v0.0.0-20260905035102-160fafc42237
if [[ -x /usr/local/bin/runsc ]] && /usr/local/bin/runsc --version >/dev/null 2>&1; then
	log "runsc present at /usr/local/bin/runsc"
else
	log "building runsc $runsc_version (static; about 2 minutes)"
	gobin=$(mktemp -d /tmp/agentbox-runsc.XXXXXX)
	PATH="$PATH:/usr/local/go/bin" CGO_ENABLED=0 GOFLAGS=-mod=mod GOBIN="$gobin" \
		go install -ldflags="-s -w" "gvisor.dev/gvisor/runsc@$runsc_version"
	install -m 0755 "$gobin/runsc" /usr/local/bin/runsc
	rm -rf "$gobin"
fi

# CRIU >= 4.2 for pause/resume/fork of runc sandboxes: 4.1 cannot dump TCP
# sockets on kernels >= 6.16 and Debian 12 ships 3.17. Built from Debian
# sid's source package (seconds to compile) and installed at a stable path
# the server looks for first, leaving the system criu alone.
# Our patches (scripts/criu-*.patch, applied in name order): criu-rlimit-eperm
# lets CRIU read the rlimits of sandbox processes of other users where the host
# withholds CAP_SYS_RESOURCE; criu-userns-nondumpable lets it dump again a
# sandbox it restored whose envd is non-dumpable; criu-uffd-userns has the
# lazy-pages daemon pass /dev/userfaultfd to a restore into a user namespace
# (lazy resume, internal/runtime/runc/lazy.go); criu-tmpfs-plain archives a
# tmpfs mount as plain tar instead of tar | gzip (two process starts fewer per
# mount on each dump and restore) and an empty read-only one (a masked
# directory) as an empty archive without running tar; it still restores the
# gzip'd archives of earlier images. A stamp next to the binary records which
# patches it was built with.
criu_bin=/usr/local/libexec/agentbox/criu
criu_patches=("$root"/scripts/criu-*.patch)
criu_stamp=$(cat "${criu_patches[@]}" | sha256sum | cut -c1-16)
criu_ok() { # criu_ok <binary>: version >= 4.2?
	local v
	v=$("$1" --version 2>/dev/null | sed -n 's/^Version: *//p')
	[[ -n $v ]] && printf '4.2\n%s\n' "$v" | sort -V -C
}
if criu_ok "$criu_bin" && [[ $(cat "$criu_bin.patch" 2>/dev/null) == "$criu_stamp" ]]; then
	log "criu $("$criu_bin" --version | sed -n 's/^Version: *//p') present at $criu_bin"
else
	log "building CRIU >= 4.2 from Debian sid's source package"
	export DEBIAN_FRONTEND=noninteractive
	build=()
	for p in build-essential pkg-config libprotobuf-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler \
		python3-protobuf libnl-3-dev libnet1-dev libcap-dev libbsd-dev libaio-dev libgnutls28-dev libnftables-dev \
		uuid-dev libdrm-dev xz-utils dpkg-dev patch; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || build+=("$p")
	done
	((${#build[@]} == 0)) || apt-get install -y -qq --no-install-recommends "${build[@]}"
	work=$(mktemp -d /tmp/agentbox-criu.XXXXXX)
	trap 'rm -rf "$work"' EXIT
	mirror=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n1)
	[[ -n $mirror ]] || mirror=$(awk '$1=="deb"{print $2; exit}' /etc/apt/sources.list 2>/dev/null)
	[[ -n $mirror ]] || mirror=http://deb.debian.org/debian
	# A private apt configuration: the machine's own sources stay untouched.
	mkdir -p "$work/apt/lists/partial" "$work/apt/sources.list.d"
	echo "deb-src [trusted=yes] $mirror sid main" >"$work/apt/sources.list"
	aptopts=(-o "Dir::Etc::SourceList=$work/apt/sources.list" -o "Dir::Etc::SourceParts=$work/apt/sources.list.d"
		-o "Dir::State::Lists=$work/apt/lists" -o APT::Sandbox::User=root)
	apt-get "${aptopts[@]}" update -qq
	(cd "$work" && apt-get "${aptopts[@]}" source --download-only criu/sid >/dev/null 2>&1 || true)
	orig=$(ls "$work"/criu_*.orig.tar.* 2>/dev/null | head -n1)
	if [[ -z $orig ]]; then
		log "could not download the criu source package from $mirror (sid); pause/resume/fork will be unavailable"
	else
		tar -C "$work" -xf "$orig"
		src=$(find "$work" -maxdepth 1 -type d -name 'criu-*' | head -n1)
		for p in "${criu_patches[@]}"; do
			patch -d "$src" -p1 <"$p" >/dev/null
		done
		make -C "$src" -j"$(nproc)" criu >"$work/build.log" 2>&1 || { tail -n 30 "$work/build.log" >&2; exit 1; }
		install -D -m 0755 "$src/criu/criu" "$criu_bin"
		echo "$criu_stamp" >"$criu_bin.patch"
		criu_ok "$criu_bin" || { log "built criu is older than 4.2"; exit 1; }
		log "installed criu $("$criu_bin" --version | sed -n 's/^Version: *//p') at $criu_bin"
	fi
	rm -rf "$work"
	trap - EXIT
fi

# The microvm tier's guest kernel: Debian's cloud kernel, unpacked from its
# .deb (not installed: the host keeps its own kernel) into
# /var/cache/agentbox/microvm/<version>/ as an uncompressed vmlinux (booted
# through PVH: the LZ4 decompressor is slow under TCG) plus the modules the
# guest needs, in dependency order (the server builds the initrd with them).
microvm_pkg=linux-image-6.1.0-56-cloud-amd64
microvm_dir=/var/cache/agentbox/microvm/${microvm_pkg#linux-image-}
microvm_modules=(drivers/virtio/virtio_ring drivers/virtio/virtio drivers/virtio/virtio_mmio drivers/block/virtio_blk
	net/core/failover drivers/net/net_failover drivers/net/virtio_net fs/overlayfs/overlay)
if [[ -s $microvm_dir/vmlinux && -s $microvm_dir/modules/order ]]; then
	log "microvm guest kernel present at $microvm_dir"
else
	log "unpacking the microvm guest kernel $microvm_pkg"
	work=$(mktemp -d /tmp/agentbox-kernel.XXXXXX)
	(cd "$work" && apt-get download -qq "$microvm_pkg" 2>/dev/null) || { apt-get update -qq; (cd "$work" && apt-get download -qq "$microvm_pkg"); }
	dpkg-deb -x "$work"/"$microvm_pkg"_*.deb "$work/x"
	vmlinuz=$(echo "$work"/x/boot/vmlinuz-*)
	# The bzImage's setup header locates the compressed payload:
	# setup_sects (0x1f1), payload_offset (0x248), payload_length (0x24c).
	setup_sects=$(od -An -t u1 -j 497 -N1 "$vmlinuz")
	payload_offset=$(od -An -t u4 -j 584 -N4 "$vmlinuz")
	payload_length=$(od -An -t u4 -j 588 -N4 "$vmlinuz")
	tail -c +$(((setup_sects + 1) * 512 + payload_offset + 1)) "$vmlinuz" >"$work/payload"
	truncate -s "$payload_length" "$work/payload"
	# lz4 exits 1 on the legacy frame's end even when all went well: check the result.
	lz4 -dc "$work/payload" >"$work/vmlinux" 2>/dev/null || true
	[[ $(head -c 4 "$work/vmlinux" | od -An -t x1 | tr -d ' ') == 7f454c46 ]] || { log "could not unpack vmlinux from $vmlinuz"; exit 1; }
	install -d -m 0700 /var/cache/agentbox/microvm "$microvm_dir" "$microvm_dir/modules"
	: >"$work/order"
	for m in "${microvm_modules[@]}"; do
		install -m 0600 "$work"/x/lib/modules/*/kernel/"$m".ko "$microvm_dir/modules/"
		echo "${m##*/}.ko" >>"$work/order"
	done
	install -m 0600 "$work/order" "$microvm_dir/modules/order"
	install -m 0600 "$work/vmlinux" "$microvm_dir/vmlinux"
	rm -rf "$work"
	log "installed the microvm guest kernel at $microvm_dir"
fi
# etcd and kube-apiserver for the Kubernetes controller's tests (envtest),
# built from the Go module proxy and cached by version (minutes cold), so
# `make up` (AGENTBOX_DEPS=server) leaves them out: the server never runs them.
if [[ ${AGENTBOX_DEPS:-all} == all ]]; then
	bash "$root/scripts/k8s-test-bins.sh" >/dev/null
fi

# Pebble, the ACME test CA, and its DNS server for the ACME end-to-end test
# (e2e/acme): built from the Go module proxy into a directory keyed by
# version, with the test certificates its module ships (the CA that signs
# its own HTTPS, and that HTTPS's key pair).
pebble_version=v2.10.3
pebble_dir=/usr/local/libexec/agentbox/pebble-$pebble_version
if [[ ${AGENTBOX_DEPS:-all} == all && ! -x $pebble_dir/pebble-challtestsrv ]]; then
	log "building pebble $pebble_version (ACME test CA)"
	tmp=$(mktemp -d /tmp/agentbox-pebble.XXXXXX)
	PATH="$PATH:/usr/local/go/bin" CGO_ENABLED=0 GOFLAGS=-mod=mod GOBIN="$tmp/bin" \
		go install "github.com/letsencrypt/pebble/v2/cmd/pebble@$pebble_version" "github.com/letsencrypt/pebble/v2/cmd/pebble-challtestsrv@$pebble_version"
	src=$(PATH="$PATH:/usr/local/go/bin" GOFLAGS=-mod=mod go env GOMODCACHE)/github.com/letsencrypt/pebble/v2@$pebble_version/test/certs
	mkdir -p "$pebble_dir"
	install -m 0644 "$src/pebble.minica.pem" "$src/localhost/cert.pem" "$pebble_dir/"
	install -m 0600 "$src/localhost/key.pem" "$pebble_dir/"
	install -m 0755 "$tmp/bin/pebble" "$pebble_dir/"
	install -m 0755 "$tmp/bin/pebble-challtestsrv" "$pebble_dir/"
	rm -rf "$tmp"
fi

# The end-to-end suites' pinned clients (e2b, @e2b/code-interpreter,
# @e2b/desktop, the MCP SDK, playwright-core), each installed from its lock file; a dir whose lock file
# has not changed since its last install is skipped (the tests' own npm ci
# does the same check).
for js in "$root"/e2e/js "$root"/e2e/interpreter "$root"/e2e/desktop "$root"/e2e/mcp "$root"/e2e/dashboard "$root"/e2e/outside/web "$root"/web/dashboard; do
	[[ -f $js/package-lock.json ]] || continue
	if [[ ! -f $js/node_modules/.package-lock.json || $js/package-lock.json -nt $js/node_modules/.package-lock.json || $js/package.json -nt $js/node_modules/.package-lock.json ]]; then
		log "npm ci in ${js#"$root"/}"
		(cd "$js" && npm ci --no-audit --no-fund --loglevel=error)
	else
		log "${js#"$root"/} node_modules up to date"
	fi
done
log "done"
