package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Condition types, reasons and phases a SandboxSnapshot reports.
const (
	// ConditionReady is True once the snapshot is taken (and stored in the
	// object store when the agents have one).
	ConditionReady = "Ready"

	ReasonTaking         = "Taking"
	ReasonTaken          = "Taken"
	ReasonStored         = "Stored"
	ReasonSourceNotFound = "SourceNotFound"
	ReasonSourceNotReady = "SourceNotReady"
	ReasonFailed         = "SnapshotFailed"
	ReasonUploadFailed   = "UploadFailed"

	PhasePending = "Pending"
	PhaseReady   = "Ready"
	PhaseFailed  = "Failed"
)

// Finalizer holds a SandboxSnapshot until its node agent deleted its local
// copy and its objects in the object store.
const Finalizer = "agentbox.dev/snapshot"

// SandboxRef names a Sandbox in the snapshot's own namespace.
type SandboxRef struct {
	// name of the Sandbox (agents.x-k8s.io/v1beta1) in this namespace.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +required
	Name string `json:"name"`
}

// SandboxSnapshotSpec says what to snapshot. It cannot change once made.
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec is immutable: delete the SandboxSnapshot and make a new one"
type SandboxSnapshotSpec struct {
	// sandboxRef is the running Sandbox whose memory and files are captured.
	// +required
	SandboxRef SandboxRef `json:"sandboxRef"`
	// name is the snapshot's E2B name (optional): new sandboxes may start
	// from it by this name as well as by the object's name.
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9_-]+$')",message="spec.name: use 1-128 lowercase letters, digits, '-' and '_'"
	// +optional
	Name string `json:"name,omitempty"`
}

// SandboxSnapshotStatus is what the node agent that took it reports.
type SandboxSnapshotStatus struct {
	// phase is Pending, Ready or Failed.
	// +optional
	Phase string `json:"phase,omitempty"`
	// conditions: Ready.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// snapshotID is the snapshot's id on its node.
	// +optional
	SnapshotID string `json:"snapshotID,omitempty"`
	// team is the agentbox team the snapshot belongs to: the team its
	// namespace was bound to by label when its node agent took it (empty in
	// a --kube-team namespace, which never changes team). Only agents write
	// it. serve --kubernetes lists, restores and deletes the snapshot for
	// this team alone, and a namespace holding it stays bound to this team
	// (a re-label waits until the snapshot is deleted).
	// +optional
	Team string `json:"team,omitempty"`
	// sandboxID is the E2B id of the sandbox it was taken of.
	// +optional
	SandboxID string `json:"sandboxID,omitempty"`
	// template is the agentbox template the sandbox ran (a new sandbox
	// needs the same template on its node).
	// +optional
	Template string `json:"template,omitempty"`
	// nodeName is the node holding the local copy.
	// +optional
	NodeName string `json:"nodeName,omitempty"`
	// sizeBytes is the size of the local copy.
	// +optional
	SizeBytes int64 `json:"sizeBytes,omitempty"`
	// location is the object-store prefix of the sealed image ("" when the
	// agents have no object store: only its node can start from it).
	// +optional
	Location string `json:"location,omitempty"`
	// observedGeneration is the generation the status was made for.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// SandboxSnapshot is a persistent snapshot (memory and files) of a running
// Sandbox, owned by the team that took it. Its namespace keeps that team
// while it exists, and only Sandboxes of the same namespace start from it
// (annotation agentbox.dev/snapshot).
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=sbxsnap
// +kubebuilder:printcolumn:name="Sandbox",type=string,JSONPath=`.spec.sandboxRef.name`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Team",type=string,JSONPath=`.status.team`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.status.nodeName`
// +kubebuilder:printcolumn:name="Size",type=integer,JSONPath=`.status.sizeBytes`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type SandboxSnapshot struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`
	// +required
	Spec SandboxSnapshotSpec `json:"spec"`
	// +optional
	Status SandboxSnapshotStatus `json:"status,omitempty"`
}

// SandboxSnapshotList is a list of SandboxSnapshots.
// +kubebuilder:object:root=true
type SandboxSnapshotList struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SandboxSnapshot `json:"items"`
}
