package kube

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	abv1 "github.com/agentbox/agentbox/internal/kube/apis/agentbox/v1alpha1"
	agentsv1 "github.com/agentbox/agentbox/internal/kube/apis/agents/v1beta1"
)

func TestBindings(t *testing.T) {
	b := newBindings(Config{Teams: map[string]string{"fixed": "t-fixed", "both": "t-flag"}})
	b.set("late", nsBinding{id: "t-late", name: "late-team"}, true)
	b.set("both", nsBinding{id: "t-label", name: "label-team"}, true)
	if got := b.namespaces(); !slices.Equal(got, []string{"both", "fixed", "late"}) {
		t.Errorf("namespaces %v", got)
	}
	for _, tc := range []struct {
		ns, id, name string
		ok           bool
	}{
		// --kube-team wins over a label, and its Sandboxes get no team
		// label (it is never re-bound).
		{"both", "t-flag", "", true},
		{"fixed", "t-fixed", "", true},
		{"late", "t-late", "late-team", true},
		{"other", "", "", false},
	} {
		got, ok := b.team(tc.ns)
		if ok != tc.ok || got.id != tc.id || got.name != tc.name {
			t.Errorf("%s: %+v %v, want id %q name %q %v", tc.ns, got, ok, tc.id, tc.name, tc.ok)
		}
	}
	b.set("late", nsBinding{}, false)
	if _, ok := b.team("late"); ok {
		t.Error("late still bound after unbinding")
	}
}

func TestBoundTeam(t *testing.T) {
	scheme, err := Scheme()
	if err != nil {
		t.Fatal(err)
	}
	sandbox := func(team, id string) client.Object {
		o := &agentsv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Name: "sb-" + team + id, Namespace: "ns", Labels: map[string]string{LabelTeam: team}}}
		o.Status.SandboxID = id
		return o
	}
	snapshot := func(team, id string) client.Object {
		o := &abv1.SandboxSnapshot{ObjectMeta: metav1.ObjectMeta{Name: "snap-" + team + id, Namespace: "ns"}}
		o.Status.Team, o.Status.SnapshotID = team, id
		return o
	}
	for _, tc := range []struct {
		name  string
		label string
		objs  []client.Object
		want  string
	}{
		{"empty, labelled", "b", nil, "b"},
		{"empty, unlabelled", "", nil, ""},
		{"another team's snapshot holds it", "b", []client.Object{snapshot("a", "s1")}, "a"},
		{"a snapshot not taken yet holds nothing", "b", []client.Object{snapshot("a", "")}, "b"},
		{"its own team's snapshot", "b", []client.Object{snapshot("b", "s1")}, "b"},
		{"a --kube-team snapshot (no team) holds nothing", "b", []client.Object{snapshot("", "s1")}, "b"},
		{"another team's sandbox holds it", "b", []client.Object{sandbox("a", "i1")}, "a"},
		{"a sandbox that never ran holds nothing", "b", []client.Object{sandbox("a", "")}, "b"},
		{"unlabelled, a snapshot holds it", "", []client.Object{snapshot("a", "s1")}, "a"},
		{"two holders: the first", "c", []client.Object{snapshot("d", "s1"), sandbox("a", "i1"), snapshot("c", "s2")}, "a"},
	} {
		c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(tc.objs...).WithStatusSubresource(tc.objs...).Build()
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}}
		if tc.label != "" {
			ns.Labels = map[string]string{LabelTeam: tc.label}
		}
		got, err := BoundTeam(t.Context(), c, ns)
		if err != nil || got != tc.want {
			t.Errorf("%s: %q %v, want %q", tc.name, got, err, tc.want)
		}
	}
}
