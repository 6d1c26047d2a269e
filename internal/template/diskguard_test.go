package template

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/agentbox/agentbox/internal/errdefs"
)

type fullDisk struct{}

func (fullDisk) Admit(what string) error {
	return fmt.Errorf("cannot %s: the server's template disk is full: %w", what, errdefs.ErrNoSpace)
}

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
}
