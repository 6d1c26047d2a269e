package kube

import (
	coordv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// leaseCache watches the node agents' Leases alone (in their namespace,
// with their label), so placement reads them without a request per bind.
func leaseCache(ns string) map[client.Object]cache.ByObject {
	return map[client.Object]cache.ByObject{
		&coordv1.Lease{}: {
			Namespaces: map[string]cache.Config{ns: {}},
			Label:      labels.SelectorFromSet(labels.Set{LabelNodeAgent: "true"}),
		},
	}
}
