package v1beta1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Condition types and reasons a Sandbox reports.
const (
	// ConditionReady is True once the sandbox runs and its envd answers.
	ConditionReady = "Ready"
	// ConditionSuspended is True once a Suspended sandbox is paused with its
	// memory kept.
	ConditionSuspended = "Suspended"
	// ConditionFinished is True once the sandbox ended on its own (killed by
	// its timeout, failed, or its node was lost).
	ConditionFinished = "Finished"

	ReasonDependenciesReady    = "DependenciesReady"
	ReasonDependenciesNotReady = "DependenciesNotReady"
	ReasonSuspended            = "SandboxSuspended"
	ReasonPaused               = "SandboxPaused"
	ReasonNotSuspended         = "NotSuspended"
	ReasonExpired              = "SandboxExpired"
	ReasonInvalidSpec          = "InvalidSpec"
	ReasonReconcilerError      = "ReconcilerError"
	ReasonSandboxGone          = "SandboxGone"
)

// Labels and annotations shared with the extensions API.
const (
	// LabelWarmPool names the pool that owns an unclaimed sandbox.
	LabelWarmPool = "agents.x-k8s.io/warm-pool-sandbox"
	// LabelTemplateHash is the blueprint hash a pool sandbox was made from.
	LabelTemplateHash = "agents.x-k8s.io/sandbox-template-hash"
	// LabelLaunchType is "warm" (made by a pool) or "cold".
	LabelLaunchType = "agents.x-k8s.io/launch-type"
	// AnnotationTemplateRef names the SandboxTemplate a sandbox was made from.
	AnnotationTemplateRef = "agents.x-k8s.io/sandbox-template-ref"
)

// Finalizer holds a Sandbox until its agentbox sandbox is killed.
const Finalizer = "agents.x-k8s.io/agentbox-sandbox"

// PodMetadata is the part of a pod's metadata a sandbox carries.
type PodMetadata struct {
	// labels of the sandbox.
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
	// annotations of the sandbox.
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
}

// EmbeddedObjectMetadata is the metadata of an object made from a template.
type EmbeddedObjectMetadata struct {
	// name of the object.
	// +optional
	Name string `json:"name,omitempty"`
	// labels of the object.
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
	// annotations of the object.
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
}

// PodTemplate describes the sandbox as a pod. agentbox reads the first
// container: its image names the agentbox template, its env, workingDir and
// resources apply; runtimeClassName picks the isolation tier.
// +kubebuilder:validation:XValidation:rule="size(self.spec.containers) > 0 && has(self.spec.containers[0].image) && size(self.spec.containers[0].image) > 0",message="spec.podTemplate.spec.containers[0].image is required: it names the agentbox template the sandbox starts from"
type PodTemplate struct {
	// spec of the pod.
	// +required
	Spec corev1.PodSpec `json:"spec"`
	// metadata of the pod: only labels and annotations are used.
	// +optional
	ObjectMeta PodMetadata `json:"metadata"`
}

// PersistentVolumeClaimTemplate describes a claim made for a sandbox.
type PersistentVolumeClaimTemplate struct {
	// metadata of the claim.
	// +optional
	EmbeddedObjectMetadata `json:"metadata"`
	// spec of the claim.
	// +required
	Spec corev1.PersistentVolumeClaimSpec `json:"spec"`
}

// OperatingMode is the state the user wants a sandbox in.
// +kubebuilder:validation:Enum=Running;Suspended
type OperatingMode string

// Operating modes.
const (
	OperatingModeRunning   OperatingMode = "Running"
	OperatingModeSuspended OperatingMode = "Suspended"
)

// Blueprint is the configuration a Sandbox shares with a SandboxTemplate;
// a warm pool hashes it to find stale members.
type Blueprint struct {
	// podTemplate describes the sandbox.
	// +required
	PodTemplate PodTemplate `json:"podTemplate"`
	// volumeClaimTemplates lists claims the sandbox may use (not supported
	// by agentbox yet: a sandbox that sets it is refused with a condition).
	// +optional
	// +listType=atomic
	VolumeClaimTemplates []PersistentVolumeClaimTemplate `json:"volumeClaimTemplates,omitempty"`
	// service asks for a headless Service; agentbox reaches sandboxes
	// through its gateway and ignores it.
	// +optional
	Service *bool `json:"service,omitempty"`
}

// ShutdownPolicy says what happens to an expired Sandbox object.
// +kubebuilder:validation:Enum=Delete;Retain
type ShutdownPolicy string

// Shutdown policies.
const (
	ShutdownPolicyDelete ShutdownPolicy = "Delete"
	ShutdownPolicyRetain ShutdownPolicy = "Retain"
)

// Lifecycle says when a sandbox ends.
type Lifecycle struct {
	// shutdownTime is when the sandbox expires: its agentbox sandbox is
	// killed, then shutdownPolicy applies to the object.
	// +kubebuilder:validation:Format="date-time"
	// +optional
	ShutdownTime *metav1.Time `json:"shutdownTime,omitempty"`
	// shutdownPolicy: Retain (default) keeps the expired object with
	// Ready=False reason SandboxExpired; Delete deletes it.
	// +kubebuilder:default=Retain
	// +optional
	ShutdownPolicy *ShutdownPolicy `json:"shutdownPolicy,omitempty"`
}

// SandboxSpec is the desired state of a Sandbox.
type SandboxSpec struct {
	Blueprint `json:",inline"`
	// +optional
	Lifecycle `json:",inline"`
	// operatingMode: Running (default) or Suspended, which pauses the
	// sandbox with its memory kept until it is Running again.
	// +kubebuilder:default=Running
	// +optional
	OperatingMode OperatingMode `json:"operatingMode,omitempty"`
}

// SandboxStatus is the observed state of a Sandbox.
type SandboxStatus struct {
	// serviceFQDN is unused by agentbox (no Service is made).
	// +optional
	ServiceFQDN string `json:"serviceFQDN,omitempty"`
	// service is unused by agentbox (no Service is made).
	// +optional
	Service string `json:"service,omitempty"`
	// conditions of the sandbox.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// selector is the label selector of the sandbox.
	// +optional
	LabelSelector string `json:"selector,omitempty"`
	// podIPs holds the sandbox's address on its node while it runs.
	// +optional
	PodIPs []string `json:"podIPs,omitempty"`
	// nodeName is the node that runs the sandbox.
	// +optional
	NodeName string `json:"nodeName,omitempty"`
	// sandboxID is the agentbox (E2B) sandbox id: connect to it through
	// the agentbox gateway with the E2B SDKs.
	// +optional
	SandboxID string `json:"sandboxID,omitempty"`
	// team is the agentbox team that owns the sandbox.
	// +optional
	Team string `json:"team,omitempty"`
	// observedGeneration is the generation the controller last acted on.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// sandbox is what the node agent running the sandbox reports of it,
	// as agentbox's E2B API shows it (an agentbox extension).
	// +optional
	Sandbox *SandboxReport `json:"sandbox,omitempty"`
}

// SandboxReport is a running (or paused) sandbox as its node agent sees it.
type SandboxReport struct {
	// templateID is the id of the agentbox template it started from.
	TemplateID string `json:"templateID,omitempty"`
	// alias is the template alias it was created with.
	// +optional
	Alias string `json:"alias,omitempty"`
	// isolation is the tier it runs in: container, gvisor or microvm.
	// +optional
	Isolation string `json:"isolation,omitempty"`
	// cpuCount, memoryMB, diskSizeMB, pids and tmpSizeMB are its limits.
	// +optional
	CPUCount int `json:"cpuCount,omitempty"`
	// +optional
	MemoryMB int `json:"memoryMB,omitempty"`
	// +optional
	DiskSizeMB int `json:"diskSizeMB,omitempty"`
	// +optional
	PIDs int `json:"pids,omitempty"`
	// +optional
	TmpSizeMB int `json:"tmpSizeMB,omitempty"`
	// allowInternetAccess says whether it may reach the internet.
	// +optional
	AllowInternetAccess bool `json:"allowInternetAccess,omitempty"`
}

// Sandbox is one agent sandbox.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=sandbox
// +kubebuilder:storageversion
// +kubebuilder:printcolumn:name="Ready",type="string",JSONPath=".status.conditions[?(@.type=='Ready')].status"
// +kubebuilder:printcolumn:name="Reason",type="string",JSONPath=".status.conditions[?(@.type=='Ready')].reason"
// +kubebuilder:printcolumn:name="Sandbox",type="string",JSONPath=".status.sandboxID"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
type Sandbox struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`
	// +required
	Spec SandboxSpec `json:"spec"`
	// +optional
	Status SandboxStatus `json:"status,omitempty"`
}

// SandboxList is a list of Sandboxes.
// +kubebuilder:object:root=true
type SandboxList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Sandbox `json:"items"`
}
