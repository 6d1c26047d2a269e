// Package v1alpha1 holds agentbox's own Kubernetes kinds (group
// agentbox.dev), for what the agent-sandbox API has no kind for:
// SandboxSnapshot, a persistent snapshot of a Sandbox that any node agent
// can start new Sandboxes from.
//
// +kubebuilder:object:generate=true
// +groupName=agentbox.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Group and Version name this API.
const (
	Group   = "agentbox.dev"
	Version = "v1alpha1"
)

// GroupVersion returns the API's group and version.
func GroupVersion() schema.GroupVersion { return schema.GroupVersion{Group: Group, Version: Version} }

// AddToScheme registers the kinds of this API with s.
func AddToScheme(s *runtime.Scheme) error {
	gv := GroupVersion()
	s.AddKnownTypes(gv, &SandboxSnapshot{}, &SandboxSnapshotList{})
	metav1.AddToGroupVersion(s, gv)
	return nil
}
