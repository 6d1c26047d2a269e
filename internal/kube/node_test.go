package kube

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	agentsv1 "github.com/agentbox/agentbox/internal/kube/apis/agents/v1beta1"
)

func TestPlace(t *testing.T) {
	n := func(name string, live bool, freeCPU, freeMem int, tiers []string, tpls ...string) node {
		return node{live: live, NodeStatus: NodeStatus{Node: name, CPU: 16, MemoryMB: 32768, FreeCPU: freeCPU, FreeMemoryMB: freeMem,
			Tiers: tiers, UnavailableTiers: map[string]string{"gvisor": "runsc not found"}, Templates: tpls}}
	}
	both := []string{"container", "gvisor"}
	runc := []string{"container"}
	for _, tc := range []struct {
		name  string
		nodes []node
		want  want
		best  string
		why   string // a substring of the refusal; "" = placed
	}{
		{"most free memory", []node{n("a", true, 8, 4096, both, "base"), n("b", true, 8, 8192, both, "base")},
			want{template: "base", cpu: 1, mem: 512}, "b", ""},
		{"free CPU breaks a memory tie", []node{n("a", true, 2, 4096, both), n("b", true, 6, 4096, both)},
			want{cpu: 1, mem: 512}, "b", ""},
		{"template locality beats free capacity", []node{n("a", true, 2, 2048, both, "python"), n("b", true, 8, 8192, both, "base")},
			want{template: "python", cpu: 1, mem: 512}, "a", ""},
		{"room beats template locality", []node{n("a", true, 1, 256, both, "python"), n("b", true, 8, 8192, both)},
			want{template: "python", cpu: 1, mem: 512}, "b", ""},
		{"only a node with the tier", []node{n("a", true, 1, 1024, both), n("b", true, 8, 8192, runc)},
			want{tier: "gvisor", cpu: 1, mem: 512}, "a", ""},
		{"dead nodes are skipped", []node{n("a", false, 8, 8192, both), n("b", true, 1, 1024, both)},
			want{cpu: 1, mem: 512}, "b", ""},
		{"no node runs the tier", []node{n("a", true, 8, 8192, runc), n("b", false, 8, 8192, both)},
			want{tier: "gvisor"}, "", "a: runsc not found"},
		{"no live node", []node{n("a", false, 8, 8192, both)}, want{}, "", "no live node agent"},
		{"name breaks a full tie", []node{n("b", true, 4, 4096, both), n("a", true, 4, 4096, both)}, want{cpu: 1, mem: 1}, "a", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			best, why, ok := place(tc.nodes, tc.want)
			if tc.why != "" {
				if ok || !strings.Contains(why, tc.why) {
					t.Fatalf("place = %q, %q, %v; want a refusal containing %q", best, why, ok, tc.why)
				}
				return
			}
			if !ok || best != tc.best {
				t.Fatalf("place = %q, %q, %v; want %q", best, why, ok, tc.best)
			}
		})
	}
}

func TestWithBindings(t *testing.T) {
	nodes := []node{{NodeStatus: NodeStatus{Node: "a", CPU: 8, MemoryMB: 8192, FreeCPU: 8, FreeMemoryMB: 8192}}}
	got := withBindings(nodes, map[string][2]int{"a": {3, 1024}})
	if got[0].FreeCPU != 5 || got[0].FreeMemoryMB != 7168 {
		t.Errorf("free after bindings = %d CPU %d MiB, want 5 and 7168", got[0].FreeCPU, got[0].FreeMemoryMB)
	}
	if nodes[0].FreeCPU != 8 {
		t.Error("withBindings changed its input")
	}
	// The Lease's lower figure (sandboxes made through the E2B API) wins.
	nodes[0].FreeCPU = 2
	if got := withBindings(nodes, nil); got[0].FreeCPU != 2 {
		t.Errorf("free CPU = %d, want the Lease's 2", got[0].FreeCPU)
	}
}

func TestWantOf(t *testing.T) {
	gv := "gvisor"
	bad := "kata"
	sb := func(rc *string, res corev1.ResourceRequirements) *agentsv1.Sandbox {
		var o agentsv1.Sandbox
		o.Spec.PodTemplate.Spec.RuntimeClassName = rc
		o.Spec.PodTemplate.Spec.Containers = []corev1.Container{{Name: "a", Image: "docker.io/library/python:3", Resources: res}}
		return &o
	}
	lim := corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("3"), corev1.ResourceMemory: resource.MustParse("2Gi")}}
	for _, tc := range []struct {
		name string
		obj  *agentsv1.Sandbox
		want want
		err  bool
	}{
		{"no limits count as the defaults", sb(nil, corev1.ResourceRequirements{}), want{template: "python", cpu: defaultPlaceCPU, mem: defaultPlaceMem}, false},
		{"limits and tier", sb(&gv, lim), want{tier: "gvisor", template: "python", cpu: 3, mem: 2048}, false},
		{"unknown runtimeClassName", sb(&bad, lim), want{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := wantOf(tc.obj)
			if (err != nil) != tc.err || (!tc.err && got != tc.want) {
				t.Errorf("wantOf = %+v, %v; want %+v (error %v)", got, err, tc.want, tc.err)
			}
		})
	}
}
