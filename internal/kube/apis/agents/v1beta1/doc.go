// Package v1beta1 holds agentbox's Go types for the Sandbox kind of the
// agents.x-k8s.io/v1beta1 API, the Kubernetes-native agent sandbox API of
// kubernetes-sigs/agent-sandbox. Field and JSON names follow that API so
// manifests and clients written for it work unchanged against agentbox's
// controller; the types are agentbox's own.
//
// +kubebuilder:object:generate=true
// +groupName=agents.x-k8s.io
package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Group and Version name this API.
const (
	Group   = "agents.x-k8s.io"
	Version = "v1beta1"
)

// GroupVersion returns the API's group and version.
func GroupVersion() schema.GroupVersion { return schema.GroupVersion{Group: Group, Version: Version} }

// AddToScheme registers the kinds of this API with s.
func AddToScheme(s *runtime.Scheme) error {
	gv := GroupVersion()
	s.AddKnownTypes(gv, &Sandbox{}, &SandboxList{})
	metav1.AddToGroupVersion(s, gv)
	return nil
}
