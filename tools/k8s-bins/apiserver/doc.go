// Package apiserver pins kube-apiserver (k8s.io/kubernetes) and its staging
// modules so scripts/k8s-test-bins.sh can build it from the Go module proxy
// with `go build k8s.io/kubernetes/cmd/kube-apiserver`. k8s.io/kubernetes
// replaces its staging modules with local paths; the replace block here points
// them at the published tags instead. It is a module of its own so the main
// module's build, vet and tests never see it.
package apiserver
