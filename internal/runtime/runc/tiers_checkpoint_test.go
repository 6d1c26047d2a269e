package runc

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/network"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/runsc"
)

// TestPauseResumeTiers pauses and resumes a sandbox in place on both tiers,
// with its memory (processes and pids survive) and with its files only
// (a fresh init on the same writable layer); with userns, container-tier
// sandboxes own their netns and the runtime plugs every sandbox's network.
func TestPauseResumeTiers(t *testing.T) {
	for _, userns := range []bool{false, true} {
		t.Run(fmt.Sprintf("userns=%v", userns), func(t *testing.T) { testPauseResumeTiers(t, userns) })
	}
}

func testPauseResumeTiers(t *testing.T, userns bool) {
	e := setup(t, userns)
	requireCRIU(t, e)
	e.useCounterInit(t)
	ctx := context.Background()
	for i, tc := range []struct {
		name   string
		tier   string
		fsOnly bool
	}{
		{name: "runc memory", tier: Name},
		{name: "runc files only", tier: Name, fsOnly: true},
		{name: "runsc memory", tier: runsc.Name},
		{name: "runsc files only", tier: runsc.Name, fsOnly: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := e.rt.TierAvailable(tc.tier); err != nil {
				t.Skip(err)
			}
			id := "tierck" + string(rune('a'+i))
			ep := e.tierSandbox(t, id, tc.tier)
			time.Sleep(time.Second) // a count a fresh counter is far below
			count(t, ep)            // the counter runs, so the sleep's pid file is written
			sleepPid := strings.TrimSpace(get(t, ep, "read?p=/tmp/sleep.pid"))
			// A file written through the host side of the overlay lands on
			// the writable layer, as any file the sandbox writes. (gVisor
			// caches what it has seen, so only a fresh boot is sure to see
			// it: the memory cases check the sandbox's own files.)
			if err := os.WriteFile(filepath.Join(e.b.Dir(id), "rootfs", "tmp", "marker"), []byte("kept"), 0o644); err != nil {
				t.Fatal(err)
			}
			before := count(t, ep)
			if err := e.rt.Checkpoint(ctx, id, runtime.CheckpointOptions{FilesystemOnly: tc.fsOnly}); err != nil {
				t.Fatalf("checkpoint: %v", err)
			}
			if ok, err := e.rt.HasCheckpoint(ctx, id); err != nil || !ok {
				t.Fatalf("HasCheckpoint = %v, %v", ok, err)
			}
			if st, err := e.rt.State(ctx, id); err != nil || st != runtime.StatusStopped {
				t.Fatalf("state when paused = %v, %v; want stopped", st, err)
			}
			if err := e.rt.Restore(ctx, runtime.Spec{ID: id}, runtime.RestoreOptions{}); err != nil {
				t.Fatalf("restore: %v", err)
			}
			if err := e.rt.DropCheckpoint(ctx, id); err != nil {
				t.Fatal(err)
			}
			after := count(t, ep)
			if tc.fsOnly {
				if got := get(t, ep, "read?p=/tmp/marker"); got != "kept" {
					t.Fatalf("marker after resume = %q", got)
				}
				// The old count stays on the writable layer until the fresh
				// init's counter (which starts by removing it) rewrites it.
				for deadline := time.Now().Add(10 * time.Second); after >= before && time.Now().Before(deadline); {
					time.Sleep(50 * time.Millisecond)
					after = count(t, ep)
				}
				if after >= before {
					t.Fatalf("count %d after a files-only resume, %d before: want a fresh counter", after, before)
				}
				return
			}
			for deadline := time.Now().Add(10 * time.Second); after <= before && time.Now().Before(deadline); {
				time.Sleep(50 * time.Millisecond)
				after = count(t, ep)
			}
			if after <= before {
				t.Fatalf("count %d after resume, %d before: the loop did not continue", after, before)
			}
			if got := get(t, ep, "read?p=/proc/"+sleepPid+"/cmdline"); !strings.HasPrefix(got, "sleep") {
				t.Fatalf("pid %s is %q, want the same sleep", sleepPid, got)
			}
		})
	}
}

// tierSandbox is env.sandbox on a given tier.
func (e *env) tierSandbox(tb testing.TB, id, tier string) network.Endpoint {
	tb.Helper()
	ctx := context.Background()
	ep, err := e.net.Attach(ctx, id, network.Policy{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = e.rt.Delete(ctx, id)
		_ = e.net.Detach(ctx, id)
		if tier == runsc.Name {
			// runsc bind-mounts an empty netns into its root dir.
			_ = unix.Unmount(filepath.Join(e.runscRoot, "null-netns"), unix.MNT_DETACH)
		}
	})
	spec := runtime.Spec{ID: id, Layers: e.layers, NetNSPath: ep.NetNSPath, DNS: e.net.DNS(), Resources: runtime.Resources{MemoryMB: 256}, Runtime: tier}
	if err := e.rt.Create(ctx, spec); err != nil {
		tb.Fatal(err)
	}
	return ep
}
