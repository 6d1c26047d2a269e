package faults

import (
	"context"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/e2e/harness"
	"github.com/agentbox/agentbox/e2e/wire"
	"github.com/agentbox/agentbox/internal/diskspace"
)

// TestDataDiskFillsMidWrite admits a snapshot and a pause whose memory
// images are larger than the room left above the reserve, so the disk runs
// out while they are written: each answers 507 naming the data disk and
// what to free (not a bare "no space left on device"), leaves no partial
// image and gives the room back, and the sandbox keeps running with its
// processes. Once space is freed, both work.
func TestDataDiskFillsMidWrite(t *testing.T) {
	const reserveMB = 64
	s := harness.Start(t, harness.Name("faults-disk-midwrite"), harness.DataDiskMB(1024), harness.Args("--disk-reserve-mb", "64"))
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	c := wire.New(s.URL, s.APIKey)
	before := s.HostState(ctx)
	run := func(sb *wire.Sandbox, cmd, want string) {
		t.Helper()
		if r, err := c.Run(ctx, sb, "", cmd); err != nil || !strings.Contains(r.Stdout, want) {
			t.Fatalf("%s in %s: %+v %v, want %q", cmd, sb.SandboxID, r, err, want)
		}
	}
	sb := create(ctx, t, s, "container")
	// 200 MiB of process memory: the memory image outgrows the room left.
	run(sb, `(nohup python3 -c "import os,time; b=os.urandom(200<<20); open('/tmp/big-ready','w').close(); time.sleep(99999)" >/dev/null 2>&1 &) ; `+
		`until [ -e /tmp/big-ready ]; do sleep 0.1; done; echo ready`, "ready")

	// Leave the reserve plus 48 MiB free: admitted, yet too small.
	free, err := diskspace.Free(s.DataDir)
	if err != nil {
		t.Fatal(err)
	}
	filler := fillTo(t, s.DataDir, free-uint64(reserveMB+48)<<20)
	roomBefore, _ := diskspace.Free(s.DataDir)

	for _, op := range []struct {
		name string
		path string
		body any
	}{
		{"snapshot", "/sandboxes/" + sb.SandboxID + "/snapshots", map[string]any{}},
		{"pause", "/sandboxes/" + sb.SandboxID + "/pause", nil},
	} {
		st, b, err := s.Do(ctx, s.APIKey, http.MethodPost, op.path, op.body)
		if err != nil {
			t.Fatal(err)
		}
		// "ran out of space": the guard admitted it, the write ran out.
		if st != http.StatusInsufficientStorage || !strings.Contains(string(b), "data disk (--data-dir) ran out of space") || !strings.Contains(string(b), "free space") {
			t.Errorf("%s that fills the data disk: %d %s, want 507 naming the data disk and what to free", op.name, st, b)
		} else {
			t.Logf("%s: %s", op.name, b)
		}
		if st, in := getInfo(ctx, t, s, sb.SandboxID); st != http.StatusOK || in.State != "running" {
			t.Fatalf("after a %s that ran out of disk: %d %+v, want running", op.name, st, in)
		}
		run(sb, "pgrep -f big-ready >/dev/null && echo alive", "alive")
		if room, _ := diskspace.Free(s.DataDir); room+8<<20 < roomBefore {
			t.Errorf("after a failed %s the data disk has %d MiB free, had %d MiB: the partial image is left", op.name, room>>20, roomBefore>>20)
		}
	}
	if st, b, _ := s.Do(ctx, s.APIKey, http.MethodGet, "/snapshots", nil); st != http.StatusOK || strings.Contains(string(b), "snapshotID") {
		t.Errorf("snapshots after a failed snapshot: %d %s, want none", st, b)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	st, b, err := s.Do(ctx, s.APIKey, http.MethodPost, "/sandboxes/"+sb.SandboxID+"/pause", nil)
	if err != nil || st != http.StatusNoContent {
		t.Fatalf("pause once space is freed: %d %s %v", st, b, err)
	}
	if st, b, err := s.Do(ctx, s.APIKey, http.MethodPost, "/sandboxes/"+sb.SandboxID+"/connect", map[string]any{"timeout": 300}); err != nil || st != http.StatusCreated {
		t.Fatalf("resume: %d %s %v", st, b, err)
	}
	run(sb, "pgrep -f big-ready >/dev/null && echo alive", "alive")
	if err := c.Kill(ctx, sb.SandboxID); err != nil {
		t.Fatal(err)
	}
	s.WaitNoLeaks(t, before)
}

// fillTo allocates a file of n bytes in dir and returns its path.
func fillTo(t *testing.T, dir string, n uint64) string {
	t.Helper()
	f, err := os.CreateTemp(dir, "filler-")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Fallocate(int(f.Fd()), 0, 0, int64(n)); err != nil {
		t.Fatalf("fill %s: %v", dir, err)
	}
	return f.Name()
}
