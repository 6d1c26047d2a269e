package kube

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	extv1 "github.com/agentbox/agentbox/internal/kube/apis/extensions/v1beta1"
)

func TestClaimRefusal(t *testing.T) {
	tpl := func(p extv1.EnvVarsInjectionPolicy) *extv1.SandboxTemplate {
		x := &extv1.SandboxTemplate{}
		x.Name = "py"
		x.Spec.EnvVarsInjectionPolicy = p
		x.Spec.PodTemplate.Spec.Containers = []corev1.Container{{Name: "a", Image: "base", Env: []corev1.EnvVar{{Name: "SET", Value: "1"}}}}
		return x
	}
	claim := func(env ...string) *extv1.SandboxClaim {
		c := &extv1.SandboxClaim{}
		for _, e := range env {
			c.Spec.Env = append(c.Spec.Env, extv1.EnvVar{Name: e, Value: "v"})
		}
		return c
	}
	for _, tc := range []struct {
		name   string
		claim  *extv1.SandboxClaim
		policy extv1.EnvVarsInjectionPolicy
		want   string // "" = accepted; else a part of the refusal
	}{
		{"no env, default policy", claim(), "", ""},
		{"env, default policy is Disallowed", claim("NEW"), "", "spec.env"},
		{"env, Disallowed", claim("NEW"), extv1.EnvVarsDisallowed, "Disallowed"},
		{"new name, Allowed", claim("NEW"), extv1.EnvVarsAllowed, ""},
		{"template's name, Allowed", claim("NEW", "SET"), extv1.EnvVarsAllowed, "spec.env[1]"},
		{"template's name, Overrides", claim("SET"), extv1.EnvVarsOverrides, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := claimRefusal(tc.claim, tpl(tc.policy))
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Errorf("claimRefusal = %q, want %q", got, tc.want)
			}
		})
	}
}
