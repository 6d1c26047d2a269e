package crash

import (
	"slices"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/e2e/harness"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// checkFork checks what a crash in a fork left: a crash before the copies
// start (in the fork's own hidden snapshot) leaves no copy the client was
// not told of, and at any point the hidden snapshot's files (its image
// and writable layer) are gone once no copy runs on them. The parent is
// checked like every row's source (check).
func checkFork(t *testing.T, r *rig, point sandbox.CrashStep, f fixture, before harness.HostState) {
	t.Helper()
	if point.Op != "fork" {
		return
	}
	list, err := r.c.List(r.ctx, nil)
	if err != nil {
		t.Fatalf("list after restart: %v", err)
	}
	copies := 0
	for _, sb := range list {
		if sb.SandboxID != f.src {
			copies++
		}
	}
	if strings.HasPrefix(point.Step, "snapshot ") && copies > 0 {
		t.Errorf("a crash in the fork's own snapshot left %d copies the client was never told of: %+v", copies, list)
	}
	if copies > 0 {
		return // the copies own the snapshot; the row's leak check sees it go with them
	}
	// The restart's reconcile, which runs before the server answers,
	// removes the snapshot no copy runs on (the periodic collection
	// would only after its minimum age).
	left := slices.DeleteFunc(before.Leaked(r.HostState(r.ctx)), func(item string) bool {
		return !strings.HasPrefix(item, harness.KindFile+": snapshots/")
	})
	if len(left) > 0 {
		t.Errorf("the fork's hidden snapshot is left after the restart with no copy running on it: %v", left)
	}
}
