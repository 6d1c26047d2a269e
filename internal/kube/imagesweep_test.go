package kube

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	agentsv1 "github.com/agentbox/agentbox/internal/kube/apis/agents/v1beta1"
)

func TestMayHoldImage(t *testing.T) {
	cond := func(typ string) []metav1.Condition {
		return []metav1.Condition{{Type: typ, Status: metav1.ConditionFalse, Reason: "X"}}
	}
	tests := []struct {
		name string
		obj  agentsv1.Sandbox
		want bool
	}{
		{"never suspended", agentsv1.Sandbox{Status: agentsv1.SandboxStatus{Conditions: cond(agentsv1.ConditionReady)}}, false},
		// An agent that died after uploading had not written a condition yet.
		{"asked to suspend", agentsv1.Sandbox{Spec: agentsv1.SandboxSpec{OperatingMode: agentsv1.OperatingModeSuspended}}, true},
		{"suspended once", agentsv1.Sandbox{Status: agentsv1.SandboxStatus{Conditions: cond(agentsv1.ConditionSuspended)}}, true},
		{"an image stored once", agentsv1.Sandbox{Status: agentsv1.SandboxStatus{Conditions: cond(ConditionImageStored)}}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := mayHoldImage(&tt.obj); got != tt.want {
				t.Errorf("mayHoldImage = %v, want %v", got, tt.want)
			}
		})
	}
}
