package kube

import (
	"slices"
	"testing"
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
