package runc

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/bundle"
)

func TestFreezeTimeoutConf(t *testing.T) {
	for _, tc := range []struct {
		in   time.Duration
		want string
	}{
		{time.Second, "timeout 1"},
		{1500 * time.Millisecond, "timeout 2"},
		{DefaultFreezeTimeout, "timeout 30"},
		{2 * time.Minute, "timeout 120"},
	} {
		if got := freezeTimeoutConf(tc.in); got != tc.want {
			t.Errorf("freezeTimeoutConf(%s) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestFreezeTimedOut(t *testing.T) {
	for _, tc := range []struct {
		log  string
		want bool
	}{
		// CRIU 4.2's words when the cgroup freezer gives up.
		{"(00.1) Error (criu/seize.c:635): Unable to freeze cgroup /sys/fs/cgroup/freezer/x (100 x 100ms attempts, timeout: 10s)\n", true},
		{"(00.1) Error (criu/mem.c:711): Can't dump pages\n", false},
		{"", false},
	} {
		work := t.TempDir()
		if tc.log != "" {
			if err := os.WriteFile(filepath.Join(work, "dump.log"), []byte(tc.log), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if got := freezeTimedOut(work); got != tc.want {
			t.Errorf("freezeTimedOut(%q) = %v, want %v", tc.log, got, tc.want)
		}
	}
}

// A pause that fails after CRIU froze and seized the sandbox (CRIU's own
// fault injection fails the page dump) leaves it running and usable, and
// the next pause succeeds with the configured freeze timeout.
func TestFailedPauseKeepsSandboxRunning(t *testing.T) {
	e := setup(t)
	requireCRIU(t, e)
	ctx := context.Background()
	e.useCounterInit(t)
	ep := e.sandbox(t, "ckfail", runtime.Resources{MemoryMB: 256})
	before := count(t, ep)

	t.Setenv("CRIU_FAULT", "3") // FI_DUMP_PAGES: runc and CRIU inherit it
	err := e.rt.Checkpoint(ctx, "ckfail", runtime.CheckpointOptions{})
	os.Unsetenv("CRIU_FAULT")
	if err == nil {
		t.Fatal("checkpoint with an injected CRIU fault succeeded")
	}
	if st, err := e.rt.State(ctx, "ckfail"); err != nil || st != runtime.StatusRunning {
		t.Fatalf("state after a failed pause = %v, %v; want running", st, err)
	}
	if ok, _ := e.rt.HasCheckpoint(ctx, "ckfail"); ok {
		t.Fatal("a failed pause left a checkpoint")
	}
	after := count(t, ep)
	for deadline := time.Now().Add(10 * time.Second); after <= before && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		after = count(t, ep)
	}
	if after <= before {
		t.Fatalf("count %d after the failed pause, %d before: the sandbox is not running", after, before)
	}

	if err := e.rt.Checkpoint(ctx, "ckfail", runtime.CheckpointOptions{}); err != nil {
		t.Fatalf("pause after a failed one: %v", err)
	}
	log, _ := os.ReadFile(filepath.Join(e.b.Dir("ckfail"), bundle.CRIUWorkDir, "dump.log"))
	if !strings.Contains(string(log), "timeout: 30s") {
		t.Errorf("CRIU did not take the freeze timeout of %s; its dump log:\n%.2000s", DefaultFreezeTimeout, log)
	}
	if err := e.rt.Restore(ctx, runtime.Spec{ID: "ckfail"}, runtime.RestoreOptions{}); err != nil {
		t.Fatalf("restore: %v", err)
	}
	if st, _ := e.rt.State(ctx, "ckfail"); st != runtime.StatusRunning {
		t.Fatalf("state after restore = %v", st)
	}
}
