// Package v1beta1 holds agentbox's Go types for the SandboxTemplate,
// SandboxClaim and SandboxWarmPool kinds of extensions.agents.x-k8s.io/v1beta1
// (kubernetes-sigs/agent-sandbox's extensions API), with its field and JSON
// names so manifests written for it work unchanged; the types are agentbox's
// own.
//
// +kubebuilder:object:generate=true
// +groupName=extensions.agents.x-k8s.io
package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Group and Version name this API.
const (
	Group   = "extensions.agents.x-k8s.io"
	Version = "v1beta1"
)

// GroupVersion returns the API's group and version.
func GroupVersion() schema.GroupVersion { return schema.GroupVersion{Group: Group, Version: Version} }

// AddToScheme registers the kinds of this API with s.
func AddToScheme(s *runtime.Scheme) error {
	gv := GroupVersion()
	s.AddKnownTypes(gv,
		&SandboxTemplate{}, &SandboxTemplateList{},
		&SandboxClaim{}, &SandboxClaimList{},
		&SandboxWarmPool{}, &SandboxWarmPoolList{})
	metav1.AddToGroupVersion(s, gv)
	return nil
}
