package template

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/diskspace"
	"github.com/agentbox/agentbox/internal/errdefs"
)

type fullDisk struct{}

func (fullDisk) Admit(what string) error {
	return fmt.Errorf("cannot %s: the server's template disk is full: %w", what, errdefs.ErrNoSpace)
}

func (fullDisk) Explain(_ string, err error) error { return err }

// TestDiskGuardRefusesBuildsAndUploads: on a full disk, builds and uploads
// are refused with ErrNoSpace before they write anything.
func TestDiskGuardRefusesBuildsAndUploads(t *testing.T) {
	s, err := NewStore(t.TempDir(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	s.SetDiskGuard(fullDisk{})
	for _, op := range []struct {
		name string
		do   func() error
	}{
		{"upload", func() error {
			_, err := s.PutUpload("team", strings.Repeat("a", 64), strings.NewReader("x"), 1<<20, false)
			return err
		}},
		{"build", func() error {
			_, err := s.Build(context.Background(), Definition{}, nil, nil)
			return err
		}},
		{"build from spec", func() error {
			_, err := s.BuildFromSpec(context.Background(), BuildSpec{TeamID: "team", Name: "x"}, nil)
			return err
		}},
	} {
		if err := op.do(); !errors.Is(err, errdefs.ErrNoSpace) {
			t.Errorf("%s on a full disk: %v, want ErrNoSpace", op.name, err)
		}
	}
}

// switchDisk is a disk guard whose disk is full until freed.
type switchDisk struct{ full atomic.Bool }

func (*switchDisk) Explain(_ string, err error) error { return err }

func (d *switchDisk) Admit(what string) error {
	if d.full.Load() {
		return fullDisk{}.Admit(what)
	}
	return nil
}

// TestDiskGuardRefusesBuildStart: on a full disk, starting a requested
// build is refused with ErrNoSpace (the client's answer, not a build that
// fails later); the build stays waiting and starts once there is room.
func TestDiskGuardRefusesBuildStart(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t)
	disk := &switchDisk{}
	disk.full.Store(true)
	s.SetDiskGuard(disk)
	b, err := NewBuilds(ctx, s, &fakeRunner{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	j, err := b.Request(ctx, "a", BuildRequest{Name: "full", CPUCount: 1, MemoryMB: 256})
	if err != nil {
		t.Fatal(err)
	}
	spec := BuildSpec{From: "scratch", Steps: []Step{{Op: OpRun, Args: []string{"fake-write /x y"}}}}
	if err := b.Start(ctx, "a", j.TemplateID, j.BuildID, spec); !errors.Is(err, errdefs.ErrNoSpace) || !strings.Contains(err.Error(), "template disk") {
		t.Fatalf("start on a full disk: %v, want ErrNoSpace naming the disk", err)
	}
	if st, _ := b.Status(ctx, "a", j.TemplateID, j.BuildID, 0, 0, ""); st.Status != StatusWaiting {
		t.Fatalf("a build refused for space is %s, want waiting", st.Status)
	}
	disk.full.Store(false)
	if err := b.Start(ctx, "a", j.TemplateID, j.BuildID, spec); err != nil {
		t.Fatalf("start once there is room: %v", err)
	}
	if st := waitBuild(t, b, j); st.Status != StatusReady {
		t.Fatalf("the build started once there was room: %s %+v", st.Status, st.Reason)
	}
}

// waitBuild waits until j's build ends and returns its status.
func waitBuild(t *testing.T, b *Builds, j *Job) *BuildStatus {
	t.Helper()
	for {
		st, err := b.Status(context.Background(), j.TeamID, j.TemplateID, j.BuildID, 0, 0, "")
		if err != nil {
			t.Fatal(err)
		}
		if st.Status != StatusWaiting && st.Status != StatusBuilding {
			return st
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// enospcRunner runs no step: its writes ran out of disk.
type enospcRunner struct{}

func (enospcRunner) RunSteps(context.Context, StepRequest) error {
	return fmt.Errorf("commit layer: %w", &os.PathError{Op: "write", Path: "layer", Err: unix.ENOSPC})
}

// TestDiskRunsOutMidBuild: a build and an upload the guard admitted whose
// writes run out of disk fail naming the disk and what to free (the
// build's status reason, the upload's ErrNoSpace), not the writer's words.
func TestDiskRunsOutMidBuild(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t)
	g, err := diskspace.New(1, diskspace.Disk{Name: "template disk (--template-dir)", Dir: t.TempDir(), ToFree: "templates no longer used"})
	if err != nil {
		t.Fatal(err)
	}
	s.SetDiskGuard(g)
	b, err := NewBuilds(ctx, s, enospcRunner{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	j, err := b.Request(ctx, "a", BuildRequest{Name: "mid", CPUCount: 1, MemoryMB: 256})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx, "a", j.TemplateID, j.BuildID, BuildSpec{From: "scratch", Steps: []Step{{Op: OpRun, Args: []string{"true"}}}}); err != nil {
		t.Fatal(err)
	}
	if st := waitBuild(t, b, j); st.Status != StatusError || st.Reason == nil || !strings.Contains(st.Reason.Message, "template disk (--template-dir) ran out of space") {
		t.Fatalf("a build whose writes ran out of disk: %s %+v, want an error naming the template disk", st.Status, st.Reason)
	}
	_, err = s.PutUpload("a", strings.Repeat("b", 64), iotest.ErrReader(&os.PathError{Op: "write", Path: "upload", Err: unix.ENOSPC}), 1<<20, false)
	if !errors.Is(err, errdefs.ErrNoSpace) || !strings.Contains(err.Error(), "template disk") {
		t.Fatalf("an upload whose write ran out of disk: %v, want ErrNoSpace naming the template disk", err)
	}
}

// TestExplainDiskKeepsCommandFailures: a build command that fails saying
// "no space left on device" is the tenant's failure, not a full disk.
func TestExplainDiskKeepsCommandFailures(t *testing.T) {
	s := newTestStore(t)
	g, err := diskspace.New(1, diskspace.Disk{Name: "template disk", Dir: t.TempDir(), ToFree: "templates"})
	if err != nil {
		t.Fatal(err)
	}
	s.SetDiskGuard(g)
	cmd := fmt.Errorf("step 1: %w", &ExitError{Cmd: "echo no space left on device; exit 1", Code: 1})
	if got := s.explainDisk("build a template", cmd); got != cmd {
		t.Fatalf("a command's failure became %v", got)
	}
}
