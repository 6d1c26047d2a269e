package v1beta1

import (
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	agentsv1beta1 "github.com/agentbox/agentbox/internal/kube/apis/agents/v1beta1"
)

// Condition reasons a SandboxClaim reports on its Ready condition.
const (
	ReasonWarmPoolNotFound = "WarmPoolNotFound"
	ReasonTemplateNotFound = "TemplateNotFound"
	ReasonInvalidClaim     = "InvalidClaim"
	ReasonClaimExpired     = "ClaimExpired"
	ReasonSandboxNotReady  = "SandboxNotReady"
	ReasonSandboxReady     = "SandboxReady"
)

// AnnotationSandboxName on a claim names the Sandbox it holds.
const AnnotationSandboxName = "agents.x-k8s.io/sandbox-name"

// NetworkPolicyManagement says whether the controller manages a template's
// network policy.
// +kubebuilder:validation:Enum=Managed;Unmanaged
type NetworkPolicyManagement string

// EnvVarsInjectionPolicy says whether a claim may set environment variables.
// +kubebuilder:validation:Enum=Allowed;Overrides;Disallowed
type EnvVarsInjectionPolicy string

// VolumeClaimTemplatesPolicy says whether a claim may add volume claims.
// +kubebuilder:validation:Enum=Allowed;Overrides;Disallowed
type VolumeClaimTemplatesPolicy string

// Policy values.
const (
	NetworkPolicyManaged   NetworkPolicyManagement = "Managed"
	NetworkPolicyUnmanaged NetworkPolicyManagement = "Unmanaged"

	EnvVarsAllowed    EnvVarsInjectionPolicy = "Allowed"
	EnvVarsOverrides  EnvVarsInjectionPolicy = "Overrides"
	EnvVarsDisallowed EnvVarsInjectionPolicy = "Disallowed"

	VolumeClaimTemplatesDisallowed VolumeClaimTemplatesPolicy = "Disallowed"
)

// NetworkPolicySpec is a template's ingress and egress rules. agentbox
// enforces egress itself (see docs/kubernetes.md); the rules are accepted
// for compatibility.
type NetworkPolicySpec struct {
	// +optional
	Ingress []networkingv1.NetworkPolicyIngressRule `json:"ingress,omitempty"`
	// +optional
	Egress []networkingv1.NetworkPolicyEgressRule `json:"egress,omitempty"`
}

// SandboxTemplateSpec is a reusable sandbox blueprint plus the policies of
// the claims made from it.
type SandboxTemplateSpec struct {
	agentsv1beta1.Blueprint `json:",inline"`
	// +optional
	NetworkPolicy *NetworkPolicySpec `json:"networkPolicy,omitempty"`
	// +kubebuilder:default=Managed
	// +optional
	NetworkPolicyManagement NetworkPolicyManagement `json:"networkPolicyManagement,omitempty"`
	// envVarsInjectionPolicy: Disallowed (default) refuses claims that set
	// env; Allowed lets them add names the template lacks; Overrides lets
	// them replace values too. A claim that sets env always cold-starts.
	// +kubebuilder:default=Disallowed
	// +optional
	EnvVarsInjectionPolicy EnvVarsInjectionPolicy `json:"envVarsInjectionPolicy,omitempty"`
	// +kubebuilder:default=Disallowed
	// +optional
	VolumeClaimTemplatesPolicy VolumeClaimTemplatesPolicy `json:"volumeClaimTemplatesPolicy,omitempty"`
}

// SandboxTemplate is a named sandbox blueprint.
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced
// +kubebuilder:storageversion
type SandboxTemplate struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`
	// +required
	Spec SandboxTemplateSpec `json:"spec"`
}

// SandboxTemplateList is a list of SandboxTemplates.
// +kubebuilder:object:root=true
type SandboxTemplateList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SandboxTemplate `json:"items"`
}

// ClaimShutdownPolicy says what happens to an expired claim.
// +kubebuilder:validation:Enum=Delete;DeleteForeground;Retain
type ClaimShutdownPolicy string

// Claim shutdown policies.
const (
	ClaimShutdownDelete           ClaimShutdownPolicy = "Delete"
	ClaimShutdownDeleteForeground ClaimShutdownPolicy = "DeleteForeground"
	ClaimShutdownRetain           ClaimShutdownPolicy = "Retain"
)

// ClaimLifecycle says when a claim ends.
type ClaimLifecycle struct {
	// shutdownTime is when the claim expires: its sandbox is deleted, then
	// shutdownPolicy applies to the claim.
	// +kubebuilder:validation:Format="date-time"
	// +optional
	ShutdownTime *metav1.Time `json:"shutdownTime,omitempty"`
	// ttlSecondsAfterFinished deletes a finished claim that many seconds
	// after its Finished condition turned True.
	// +kubebuilder:validation:Minimum=0
	// +optional
	TTLSecondsAfterFinished *int32 `json:"ttlSecondsAfterFinished,omitempty"`
	// +kubebuilder:default=Retain
	// +optional
	ShutdownPolicy ClaimShutdownPolicy `json:"shutdownPolicy,omitempty"`
}

// WarmPoolRef names a SandboxWarmPool.
type WarmPoolRef struct {
	// name of the SandboxWarmPool in the claim's namespace.
	// +kubebuilder:validation:MinLength=1
	// +required
	Name string `json:"name"`
}

// EnvVar is one environment variable a claim sets.
type EnvVar struct {
	// +kubebuilder:validation:MinLength=1
	// +required
	Name string `json:"name"`
	// +required
	Value string `json:"value"`
	// containerName defaults to the first container (the only one agentbox
	// runs).
	// +optional
	ContainerName string `json:"containerName,omitempty"`
}

// SandboxClaimSpec is what a claim asks for.
type SandboxClaimSpec struct {
	// warmPoolRef is the pool to take a ready sandbox from; when it has
	// none, a sandbox is cold-started from the pool's template.
	// +required
	WarmPoolRef WarmPoolRef `json:"warmPoolRef"`
	// +optional
	Lifecycle *ClaimLifecycle `json:"lifecycle,omitempty"`
	// +optional
	AdditionalPodMetadata agentsv1beta1.PodMetadata `json:"additionalPodMetadata,omitempty"`
	// +optional
	// +listType=atomic
	Env []EnvVar `json:"env,omitempty"`
	// +optional
	// +listType=atomic
	VolumeClaimTemplates []agentsv1beta1.PersistentVolumeClaimTemplate `json:"volumeClaimTemplates,omitempty"`
}

// ClaimedSandbox is the sandbox a claim holds.
type ClaimedSandbox struct {
	// +optional
	Name string `json:"name,omitempty"`
	// +optional
	PodIPs []string `json:"podIPs,omitempty"`
	// sandboxID is the agentbox (E2B) sandbox id.
	// +optional
	SandboxID string `json:"sandboxID,omitempty"`
}

// SandboxClaimStatus is the observed state of a claim.
type SandboxClaimStatus struct {
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// +optional
	SandboxStatus ClaimedSandbox `json:"sandbox,omitempty"`
}

// SandboxClaim takes one sandbox from a warm pool.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced
// +kubebuilder:storageversion
// +kubebuilder:printcolumn:name="Ready",type="string",JSONPath=".status.conditions[?(@.type=='Ready')].status"
// +kubebuilder:printcolumn:name="Reason",type="string",JSONPath=".status.conditions[?(@.type=='Ready')].reason"
// +kubebuilder:printcolumn:name="Sandbox",type="string",JSONPath=".status.sandbox.name"
type SandboxClaim struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`
	// +required
	Spec SandboxClaimSpec `json:"spec"`
	// +optional
	Status SandboxClaimStatus `json:"status,omitempty"`
}

// SandboxClaimList is a list of SandboxClaims.
// +kubebuilder:object:root=true
type SandboxClaimList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SandboxClaim `json:"items"`
}

// TemplateRef names a SandboxTemplate.
type TemplateRef struct {
	// name of the SandboxTemplate in the pool's namespace.
	// +kubebuilder:validation:MinLength=1
	// +required
	Name string `json:"name"`
}

// UpdateStrategyType says how a pool replaces stale members.
// +kubebuilder:validation:Enum=Recreate;OnReplenish
type UpdateStrategyType string

// Update strategies.
const (
	// UpdateRecreate deletes stale unclaimed members at once.
	UpdateRecreate UpdateStrategyType = "Recreate"
	// UpdateOnReplenish leaves stale members until they are claimed or
	// deleted.
	UpdateOnReplenish UpdateStrategyType = "OnReplenish"
)

// UpdateStrategy says how a pool replaces stale members.
type UpdateStrategy struct {
	// +kubebuilder:default=OnReplenish
	// +optional
	Type UpdateStrategyType `json:"type,omitempty"`
}

// SandboxWarmPoolSpec is the desired state of a pool.
type SandboxWarmPoolSpec struct {
	// replicas is how many unclaimed sandboxes the pool keeps.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`
	// sandboxTemplateRef is the template the pool's sandboxes are made from.
	// +required
	TemplateRef TemplateRef `json:"sandboxTemplateRef"`
	// +optional
	UpdateStrategy *UpdateStrategy `json:"updateStrategy,omitempty"`
}

// SandboxWarmPoolStatus is the observed state of a pool.
type SandboxWarmPoolStatus struct {
	// +optional
	Replicas int32 `json:"replicas,omitempty"`
	// +optional
	ReadyReplicas int32 `json:"readyReplicas,omitempty"`
	// +optional
	Selector string `json:"selector,omitempty"`
	// +optional
	// +kubebuilder:validation:Minimum=0
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// SandboxWarmPool keeps a number of ready, unclaimed sandboxes.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:resource:scope=Namespaced
// +kubebuilder:storageversion
// +kubebuilder:printcolumn:name="Ready",type="integer",JSONPath=".status.readyReplicas"
// +kubebuilder:printcolumn:name="Replicas",type="integer",JSONPath=".status.replicas"
type SandboxWarmPool struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`
	// +required
	Spec SandboxWarmPoolSpec `json:"spec"`
	// +optional
	Status SandboxWarmPoolStatus `json:"status,omitempty"`
}

// SandboxWarmPoolList is a list of SandboxWarmPools.
// +kubebuilder:object:root=true
type SandboxWarmPoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SandboxWarmPool `json:"items"`
}
