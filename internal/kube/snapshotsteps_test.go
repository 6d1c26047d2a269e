package kube

import (
	"slices"
	"testing"

	"github.com/agentbox/agentbox/internal/sandbox"
)

func TestSnapshotCrashSteps(t *testing.T) {
	store, restore := SnapshotCrashSteps()
	tests := []struct {
		name  string
		steps []sandbox.CrashStep
		want  []string
	}{
		{"store", store, []string{
			"snapshot-store/finalizer",
			"snapshot/persisted", "snapshot/captured", "snapshot/published", "snapshot/committed",
			"snapshot-store/take", "snapshot-store/record", "snapshot-store/export", "snapshot-store/upload", "snapshot-store/record stored",
		}},
		{"restore", restore, []string{
			"move-in/fetch image", "move-in/place image", "restore/persist creating", "restore/register",
			"snapshot-restore/import", "snapshot-restore/record",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, c := range tt.steps {
				got = append(got, c.String())
			}
			seen := map[string]bool{}
			for _, s := range got {
				if seen[s] {
					t.Errorf("crash point %s listed twice in %v", s, got)
				}
				seen[s] = true
			}
			// In the order the operation reaches them (the restore
			// pipeline's other steps may sit between these).
			last := -1
			for _, w := range tt.want {
				i := slices.Index(got, w)
				if i < 0 {
					t.Errorf("crash point %s missing from %v", w, got)
					continue
				}
				if i < last {
					t.Errorf("crash point %s comes before the one listed before it: %v", w, got)
				}
				last = i
			}
		})
	}
}
