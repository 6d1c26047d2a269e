package kubeapi

import (
	"net/http/httptest"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	agentsv1 "github.com/agentbox/agentbox/internal/kube/apis/agents/v1beta1"
)

func TestRoutedID(t *testing.T) {
	for _, tc := range []struct {
		host, hid, hport string
		id, bad          string
	}{
		{host: "api.example.com"},
		{host: "49983-iabc123.example.com", id: "iabc123"},
		{host: "49983-iabc123.example.com:3000", id: "iabc123"},
		{host: "localhost:3000", hid: "iabc", hport: "49983", id: "iabc"},
		{host: "localhost:3000", hid: "iabc", bad: "missing header E2b-Sandbox-Port"},
		{host: "localhost:3000", hport: "1", bad: "missing header E2b-Sandbox-Id"},
		{host: "localhost:3000", hid: "../x", hport: "1", bad: "Invalid sandbox ID"},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.Host = tc.host
		if tc.hid != "" {
			r.Header.Set("E2b-Sandbox-Id", tc.hid)
		}
		if tc.hport != "" {
			r.Header.Set("E2b-Sandbox-Port", tc.hport)
		}
		id, bad := routedID(r)
		if id != tc.id || bad != tc.bad {
			t.Errorf("%+v: got (%q, %q)", tc, id, bad)
		}
	}
}

func TestFailed(t *testing.T) {
	cond := func(typ string, ok bool, reason string) metav1.Condition {
		st := metav1.ConditionFalse
		if ok {
			st = metav1.ConditionTrue
		}
		return metav1.Condition{Type: typ, Status: st, Reason: reason, Message: "m"}
	}
	for _, tc := range []struct {
		name  string
		conds []metav1.Condition
		fails bool
	}{
		{"no status yet", nil, false},
		{"starting", []metav1.Condition{cond(agentsv1.ConditionReady, false, agentsv1.ReasonDependenciesNotReady)}, false},
		{"ready", []metav1.Condition{cond(agentsv1.ConditionReady, true, agentsv1.ReasonDependenciesReady)}, false},
		{"unschedulable", []metav1.Condition{cond(agentsv1.ConditionReady, false, "Unschedulable")}, true},
		{"template missing", []metav1.Condition{cond(agentsv1.ConditionReady, false, "TemplateNotFound")}, true},
		{"invalid", []metav1.Condition{cond(agentsv1.ConditionReady, false, agentsv1.ReasonInvalidSpec)}, true},
		{"finished", []metav1.Condition{cond(agentsv1.ConditionFinished, true, agentsv1.ReasonSandboxGone)}, true},
	} {
		if err := failed(tc.conds); (err != nil) != tc.fails {
			t.Errorf("%s: failed = %v, want failure %t", tc.name, err, tc.fails)
		}
	}
}
