package sandbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/diskspace"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// fullDisk refuses everything, as diskspace.Guard does on a full disk.
type fullDisk struct{ asked []string }

func (f *fullDisk) Admit(what string) error {
	f.asked = append(f.asked, what)
	return fmt.Errorf("cannot %s: the server's data disk is full: %w", what, errdefs.ErrNoSpace)
}

func (f *fullDisk) Explain(what string, err error) error {
	if err == nil || errors.Is(err, errdefs.ErrNoSpace) {
		return err
	}
	return fmt.Errorf("cannot %s: the server's data disk ran out of space: %w", what, errdefs.ErrNoSpace)
}

// TestDiskGuard: on a full disk, work that grows it is refused with
// ErrNoSpace and leaves nothing behind; a running sandbox keeps running,
// its owner can kill it, and a paused one can still be resumed.
func TestDiskGuard(t *testing.T) {
	ctx := context.Background()
	e := newFakeEnv(t, LifecycleConfig{})
	running := e.create(t, e.req())
	paused := e.create(t, e.req())
	if err := e.m.Pause(ctx, e.team, paused.ID); err != nil {
		t.Fatal(err)
	}
	g := &fullDisk{}
	e.m.admission.disk = g
	for _, op := range []struct {
		name string
		do   func() error
	}{
		{"create", func() error { _, err := e.m.Create(ctx, e.req()); return err }},
		{"snapshot", func() error { _, err := e.m.Snapshots().CreateSnapshot(ctx, e.team, running.ID, "full"); return err }},
		{"pause", func() error { return e.m.Pause(ctx, e.team, running.ID) }},
		{"fork", func() error { _, err := e.m.Snapshots().Fork(ctx, e.team, running.ID, 1, 0); return err }},
	} {
		err := op.do()
		if !errors.Is(err, errdefs.ErrNoSpace) {
			t.Errorf("%s on a full disk: %v, want ErrNoSpace", op.name, err)
		}
	}
	if got, err := e.m.Get(ctx, e.team, running.ID); err != nil || got.State != StateRunning {
		t.Fatalf("the running sandbox after refusals: %+v %v", got, err)
	}
	if _, _, err := e.m.Resume(ctx, e.team, paused.ID, 0, false); err != nil {
		t.Fatalf("resume on a full disk: %v", err)
	}
	for _, id := range []string{running.ID, paused.ID} {
		if err := e.m.Kill(ctx, e.team, id); err != nil {
			t.Fatalf("kill on a full disk: %v", err)
		}
	}
	e.noLeaks(t)
	if len(g.asked) < 4 {
		t.Errorf("the guard was asked %v", g.asked)
	}
}

// TestDiskRunsOutMidWrite: a snapshot, a pause and a create the guard
// admitted whose write runs out of disk (the runtime reports ENOSPC, as
// CRIU does, in text) answer ErrNoSpace, not the writer's words; the
// sandbox keeps running and nothing of the failed work is left.
func TestDiskRunsOutMidWrite(t *testing.T) {
	ctx := context.Background()
	e := newFakeEnv(t, LifecycleConfig{})
	running := e.create(t, e.req())
	// The real guard, on a disk with room above its 1 MiB reserve.
	g, err := diskspace.New(1, diskspace.Disk{Name: "data disk (--data-dir)", Dir: t.TempDir(), ToFree: "snapshots"})
	if err != nil {
		t.Fatal(err)
	}
	e.m.admission.disk = g
	enospc := errors.New("runc checkpoint: exit status 1: (criu: page-xfer: Unable to spice data: No space left on device)")
	for _, op := range []struct {
		name, fail string
		do         func() error
	}{
		{"snapshot", "runtime.Checkpoint", func() error {
			_, err := e.m.Snapshots().CreateSnapshot(ctx, e.team, running.ID, "mid")
			return err
		}},
		{"pause", "runtime.Checkpoint", func() error { return e.m.Pause(ctx, e.team, running.ID) }},
		{"create", "runtime.Create", func() error { _, err := e.m.Create(ctx, e.req()); return err }},
	} {
		e.h.FailNext(op.fail, enospc)
		err := op.do()
		if !errors.Is(err, errdefs.ErrNoSpace) || !strings.Contains(err.Error(), "data disk (--data-dir) ran out of space") {
			t.Errorf("%s that runs out of disk: %v, want ErrNoSpace from the guard", op.name, err)
		}
		if got, err := e.m.Get(ctx, e.team, running.ID); err != nil || got.State != StateRunning {
			t.Fatalf("after a %s that ran out of disk: %+v %v, want running", op.name, got, err)
		}
	}
	// Other failures keep their own words.
	e.h.FailNext("runtime.Checkpoint", errors.New("permission denied"))
	if err := e.m.Pause(ctx, e.team, running.ID); err == nil || errors.Is(err, errdefs.ErrNoSpace) {
		t.Errorf("a pause failing for another reason: %v", err)
	}
	if err := e.m.Kill(ctx, e.team, running.ID); err != nil {
		t.Fatal(err)
	}
	e.noLeaks(t)
}
