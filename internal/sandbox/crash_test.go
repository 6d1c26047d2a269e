package sandbox

import (
	"slices"
	"testing"
)

// Every crash point is named once, and a fork's own snapshot is crashed
// at under the fork's name before its copies' pipeline, with the release
// of the snapshot last.
func TestCrashStepsOfAFork(t *testing.T) {
	seen := map[CrashStep]bool{}
	var fork []string
	for _, c := range CrashSteps() {
		if seen[c] {
			t.Errorf("crash point %s is listed twice", c)
		}
		seen[c] = true
		if c.Op == "fork" {
			fork = append(fork, c.Step)
		}
	}
	var want []string
	for _, s := range snapshotSteps() {
		want = append(want, forkStep(s))
	}
	for _, s := range restoreSnapshot() {
		want = append(want, s.name)
	}
	want = append(want, ForkSnapshotReleased)
	if !slices.Equal(fork, want) {
		t.Errorf("fork crash points %q, want %q", fork, want)
	}
}
