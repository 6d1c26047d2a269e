// Package kwok pins kwok (sigs.k8s.io/kwok), the simulated data plane of the
// Kubernetes scale test, so scripts/k8s-test-bins.sh can build it from the Go
// module proxy with `go build sigs.k8s.io/kwok/cmd/kwok`. It is a module of
// its own so the main module's build, vet and tests never see kwok's
// Kubernetes libraries.
package kwok
