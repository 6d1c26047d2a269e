package diskspace

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
)

func TestAdmit(t *testing.T) {
	dir := t.TempDir()
	free, err := Free(dir)
	if err != nil {
		t.Fatal(err)
	}
	disk := Disk{Name: "data disk (--data-dir)", Dir: dir, ToFree: "snapshots"}
	for _, tc := range []struct {
		name    string
		reserve uint64
		refused bool
	}{
		{"room left", 1 << 20, false},
		{"under the reserve", free + 1<<30, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &Guard{disks: []Disk{disk}, reserve: tc.reserve, released: map[string]bool{}}
			err := g.Admit("create a sandbox")
			if got := err != nil; got != tc.refused {
				t.Fatalf("refused = %v (%v), want %v", got, err, tc.refused)
			}
			if !tc.refused {
				return
			}
			if !errors.Is(err, errdefs.ErrNoSpace) {
				t.Fatalf("error %v is not ErrNoSpace", err)
			}
			for _, want := range []string{"create a sandbox", "data disk (--data-dir)", "snapshots"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not name %q", err, want)
				}
			}
		})
	}
}

func TestNilGuardAdmits(t *testing.T) {
	var g *Guard
	if err := g.Admit("build"); err != nil {
		t.Fatal(err)
	}
	g.Release()
}

func TestReserveFileHeldAndReleased(t *testing.T) {
	dir := t.TempDir()
	g, err := New(4, Disk{Name: "data disk", Dir: dir, ToFree: "snapshots"})
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(dir, ReserveFile))
	if err != nil {
		t.Fatalf("no reserve file: %v", err)
	}
	if st.Size() != 1<<20 {
		t.Fatalf("reserve file is %d bytes, want %d", st.Size(), 1<<20)
	}
	g.Release()
	if _, err := os.Stat(filepath.Join(dir, ReserveFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("reserve file still there after Release: %v", err)
	}
	// With room again, the next admission makes it anew.
	if err := g.Admit("create a sandbox"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, ReserveFile)); err != nil {
		t.Fatalf("reserve file not made again: %v", err)
	}
}

func TestExplain(t *testing.T) {
	dir := t.TempDir()
	g := &Guard{disks: []Disk{{Name: "data disk (--data-dir)", Dir: dir, ToFree: "snapshots"}}, reserve: 64 << 20, released: map[string]bool{}}
	criu := errors.New("runc checkpoint: exit status 1: (criu: Error (criu/page-xfer.c:263): page-xfer: Unable to spice data: No space left on device)")
	other := errors.New("runc checkpoint: exit status 1: permission denied")
	for _, tc := range []struct {
		name    string
		g       *Guard
		err     error
		noSpace bool
	}{
		{"errno", g, fmt.Errorf("write image: %w", unix.ENOSPC), true},
		{"quota errno", g, &os.PathError{Op: "write", Path: "x", Err: unix.EDQUOT}, true},
		{"a tool's text", g, criu, true},
		{"another failure", g, other, false},
		{"no error", g, nil, false},
		{"nil guard", nil, criu, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.g.Explain("snapshot a sandbox", tc.err)
			if got := errors.Is(err, errdefs.ErrNoSpace); got != tc.noSpace {
				t.Fatalf("Explain(%v) = %v: ErrNoSpace %v, want %v", tc.err, err, got, tc.noSpace)
			}
			if !tc.noSpace {
				if err != tc.err {
					t.Fatalf("Explain changed %v into %v", tc.err, err)
				}
				return
			}
			for _, want := range []string{"cannot snapshot a sandbox", "data disk (--data-dir)", "ran out of space", "snapshots"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("%q does not name %q", err, want)
				}
			}
		})
	}
}
