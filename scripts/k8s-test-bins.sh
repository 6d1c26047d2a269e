#!/usr/bin/env bash
# Builds the two binaries the Kubernetes tests (envtest) need, etcd and
# kube-apiserver, from the Go module proxy, pinned by the modules under
# tools/k8s-bins. They land in /var/cache/agentbox/k8s-bin/<versions>/ and
# are rebuilt only when absent. Prints that directory (KUBEBUILDER_ASSETS).
# kwok, the scale test's simulated data plane, lands the same way in
# /var/cache/agentbox/k8s-bin/kwok-<version>/.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
log() { printf 'k8s-test-bins: %s\n' "$*" >&2; }
export PATH="$PATH:/usr/local/go/bin"

etcd_version=v3.6.16
k8s_version=v1.37.0
dir=/var/cache/agentbox/k8s-bin/etcd-${etcd_version}-kube-apiserver-${k8s_version}

mkdir -p "$dir"
chmod 0755 /var/cache/agentbox/k8s-bin "$dir"

if [[ ! -x $dir/etcd ]]; then
	log "building etcd $etcd_version (about 1 minute cold)"
	(cd "$root/tools/k8s-bins/etcd" && CGO_ENABLED=0 go build -mod=readonly -trimpath \
		-ldflags='-s -w' -o "$dir/etcd.tmp" .)
	mv "$dir/etcd.tmp" "$dir/etcd"
fi

if [[ ! -x $dir/kube-apiserver ]]; then
	log "building kube-apiserver $k8s_version (about 5 minutes cold)"
	minor=${k8s_version#v1.}
	minor=${minor%%.*}
	# Without the version stamps the server reports v0.0.0-master, and
	# clients that check the server version refuse it.
	ldf="-s -w -X k8s.io/component-base/version.gitVersion=$k8s_version"
	ldf+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
	ldf+=" -X k8s.io/component-base/version.gitTreeState=clean"
	ldf+=" -X k8s.io/client-go/pkg/version.gitVersion=$k8s_version"
	ldf+=" -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$minor"
	(cd "$root/tools/k8s-bins/apiserver" && CGO_ENABLED=0 go build -mod=readonly -trimpath \
		-ldflags="$ldf" -o "$dir/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver)
	mv "$dir/kube-apiserver.tmp" "$dir/kube-apiserver"
fi

kwok_version=v0.8.0
kwok_dir=/var/cache/agentbox/k8s-bin/kwok-${kwok_version}
mkdir -p "$kwok_dir"
chmod 0755 "$kwok_dir"
if [[ ! -x $kwok_dir/kwok ]]; then
	log "building kwok $kwok_version (about 2 minutes cold)"
	(cd "$root/tools/k8s-bins/kwok" && CGO_ENABLED=0 go build -mod=readonly -trimpath \
		-ldflags='-s -w' -o "$kwok_dir/kwok.tmp" sigs.k8s.io/kwok/cmd/kwok)
	mv "$kwok_dir/kwok.tmp" "$kwok_dir/kwok"
fi

echo "$dir"
