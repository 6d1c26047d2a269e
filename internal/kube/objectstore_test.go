package kube

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	agentsv1 "github.com/agentbox/agentbox/internal/kube/apis/agents/v1beta1"
)

// An agent reads or deletes only the objects of the Sandbox's own
// namespace, whatever its (user-writable) annotation says.
func TestImageOfStaysInItsNamespace(t *testing.T) {
	for _, tc := range []struct {
		name, ann string
		ok        bool
	}{
		{"own prefix", `{"node":"a","sandboxID":"iabc123","generation":2,"prefix":"agents/iabc123/2/"}`, true},
		{"another namespace", `{"node":"a","sandboxID":"iabc123","generation":2,"prefix":"other/iabc123/2/"}`, false},
		{"prefix of another generation", `{"node":"a","sandboxID":"iabc123","generation":2,"prefix":"agents/iabc123/3/"}`, false},
		{"path in the id", `{"node":"a","sandboxID":"../other","generation":2,"prefix":"agents/../other/2/"}`, false},
		{"whole bucket", `{"node":"a","sandboxID":"iabc123","generation":2,"prefix":""}`, false},
		{"not JSON", `agents/iabc123/2/`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obj := &agentsv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "agents", Annotations: map[string]string{AnnotationImage: tc.ann}}}
			if got := imageOf(obj); (got != nil) != tc.ok {
				t.Fatalf("imageOf = %+v, want ok %v", got, tc.ok)
			}
		})
	}
}
