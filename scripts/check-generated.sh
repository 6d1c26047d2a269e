#!/usr/bin/env bash
# Fails when generated code (api/gen), the dashboard's bundle
# (internal/dashboard/dist) or go.mod/go.sum are stale: it
# regenerates them (make generate, go mod tidy) and compares the result with
# what was there before. On a difference the regenerated files stay in place,
# ready to commit.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
before=$(mktemp -d)
trap 'rm -rf "$before"' EXIT
cp -a api/gen "$before/gen"
cp go.mod go.sum "$before/"
cp -a internal/dashboard/dist "$before/dashboard"
cp -a deploy/k8s/crds "$before/crds"
mkdir -p "$before/kubeapis" && cp -a internal/kube/apis "$before/kubeapis/"
make -s generate
make -s dashboard
go mod tidy
stale=0
if ! diff -r "$before/gen" api/gen >"$before/gen.diff"; then
	echo "check-generated: api/gen is stale; run 'make generate' and commit:" >&2
	head -40 "$before/gen.diff" >&2
	stale=1
fi
if ! diff -r "$before/dashboard" internal/dashboard/dist >"$before/dashboard.diff"; then
	echo "check-generated: internal/dashboard/dist is stale; run 'make dashboard' and commit:" >&2
	head -c 2000 "$before/dashboard.diff" >&2
	stale=1
fi
if ! diff -r "$before/crds" deploy/k8s/crds >"$before/crds.diff" || ! diff -r "$before/kubeapis/apis" internal/kube/apis >>"$before/crds.diff"; then
	echo "check-generated: deploy/k8s/crds or internal/kube/apis deepcopy is stale; run 'make generate' and commit:" >&2
	head -40 "$before/crds.diff" >&2
	stale=1
fi
for f in go.mod go.sum; do
	if ! diff -u "$before/$f" "$f" >&2; then
		echo "check-generated: $f is not tidy; run 'go mod tidy' and commit" >&2
		stale=1
	fi
done
exit "$stale"
