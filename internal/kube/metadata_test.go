package kube

import (
	"maps"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	agentsv1 "github.com/agentbox/agentbox/internal/kube/apis/agents/v1beta1"
)

func TestSandboxMetadata(t *testing.T) {
	base := map[string]string{MetaUID: "u1", MetaNamespace: "team-a", MetaName: "s1"}
	with := func(extra map[string]string) map[string]string {
		m := maps.Clone(base)
		maps.Copy(m, extra)
		return m
	}
	for _, tc := range []struct {
		name, annotation string
		want             map[string]string
	}{
		{"none", "", base},
		{"the caller's", `{"suite":"parity","k":"v"}`, with(map[string]string{"suite": "parity", "k": "v"})},
		{"bookkeeping keys win", `{"k8s.uid":"forged","k8s.name":"other","a":"b"}`, with(map[string]string{"a": "b"})},
		{"malformed", `{"a":1}`, base},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sb := &agentsv1.Sandbox{ObjectMeta: metav1.ObjectMeta{UID: "u1", Namespace: "team-a", Name: "s1"}}
			if tc.annotation != "" {
				sb.Annotations = map[string]string{AnnotationMetadata: tc.annotation}
			}
			if got := sandboxMetadata(sb); !maps.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
	for k, want := range map[string]bool{MetaUID: true, MetaRestoredFrom: true, "suite": false, "k8s.other": false} {
		if Bookkeeping(k) != want {
			t.Errorf("Bookkeeping(%q) = %v, want %v", k, !want, want)
		}
	}
}
