package kube

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	abv1 "github.com/agentbox/agentbox/internal/kube/apis/agentbox/v1alpha1"
	"github.com/agentbox/agentbox/internal/objstore"
)

func TestSnapshotPrefixIsItsOwn(t *testing.T) {
	// A snapshot's prefix never names, or lies inside, a suspended
	// Sandbox's image prefix of any namespace (its last segment is no
	// generation number).
	p := SnapshotPrefix("team-a", "snapabc")
	for _, img := range []string{objstore.ImagePrefix("team-a", "snapabc", 0), objstore.ImagePrefix("team-a", "snapabc", 1)} {
		if strings.HasPrefix(p, img) || strings.HasPrefix(img, p) {
			t.Errorf("snapshot prefix %s overlaps image prefix %s", p, img)
		}
	}
	if SnapshotPrefix("a", "b") == SnapshotPrefix("a", "bb") || strings.HasPrefix(SnapshotPrefix("a", "bb"), SnapshotPrefix("a", "b")) {
		t.Error("one snapshot's prefix holds another's")
	}
}

func TestStoredAtOnlyOwnPrefix(t *testing.T) {
	snap := func(ns, name, loc string) *abv1.SandboxSnapshot {
		return &abv1.SandboxSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Status: abv1.SandboxSnapshotStatus{Location: loc}}
	}
	for _, tc := range []struct {
		snap *abv1.SandboxSnapshot
		want string
	}{
		{snap("team-a", "snap1", "team-a/snap1/snapshot/"), "team-a/snap1/snapshot/"},
		{snap("team-a", "snap1", ""), ""},
		// A status written to point at another namespace's objects, or a
		// suspended Sandbox's, is ignored: never read, never deleted.
		{snap("team-b", "snap1", "team-a/snap1/snapshot/"), ""},
		{snap("team-a", "snap1", "team-a/isandbox/3/"), ""},
		{snap("team-a", "snap1", "team-a/"), ""},
	} {
		if got := storedAt(tc.snap); got != tc.want {
			t.Errorf("storedAt(%s/%s at %q) = %q, want %q", tc.snap.Namespace, tc.snap.Name, tc.snap.Status.Location, got, tc.want)
		}
	}
}
