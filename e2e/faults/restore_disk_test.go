package faults

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
	"github.com/agentbox/agentbox/e2e/wire"
)

// TestFullDataDiskRestoreResume fills the data disk with a snapshot, a
// sandbox paused with its memory and one paused with its files only on
// it. A restore of the snapshot (a new sandbox) is refused with 507 naming
// the disk and what to free, and the snapshot stays listed. Resumes are
// admitted (they make nothing new: the owner gets back what is kept, and a
// memory resume frees its image): each paused sandbox comes back with its
// files, the memory one with its processes. Once space is freed the
// snapshot restores with its files. Everything is killed at the end and
// the host holds nothing of it.
func TestFullDataDiskRestoreResume(t *testing.T) {
	const reserveMB = 64
	s := harness.Start(t, harness.Name("faults-disk-resume"), harness.DataDiskMB(1024), harness.Args("--disk-reserve-mb", "64"))
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	c := wire.New(s.URL, s.APIKey)
	before := s.HostState(ctx)
	do := func(method, path string, body any) (int, []byte) {
		t.Helper()
		st, b, err := s.Do(ctx, s.APIKey, method, path, body)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		return st, b
	}
	run := func(sb *wire.Sandbox, cmd, want string) {
		t.Helper()
		if r, err := c.Run(ctx, sb, "", cmd); err != nil || !strings.Contains(r.Stdout, want) {
			t.Fatalf("%s in %s: %+v %v, want %q", cmd, sb.SandboxID, r, err, want)
		}
	}

	src := create(ctx, t, s, "container")
	run(src, "echo snapshot-file > /home/user/kept.txt && cat /home/user/kept.txt", "snapshot-file")
	st, b := do(http.MethodPost, "/sandboxes/"+src.SandboxID+"/snapshots", map[string]any{})
	if st != http.StatusCreated {
		t.Fatalf("snapshot: %d %s", st, b)
	}
	var snap struct{ SnapshotID string }
	if err := json.Unmarshal(b, &snap); err != nil || snap.SnapshotID == "" {
		t.Fatalf("snapshot: %s %v", b, err)
	}
	snapTemplate, _, _ := strings.Cut(snap.SnapshotID, ":")
	if err := c.Kill(ctx, src.SandboxID); err != nil {
		t.Fatal(err)
	}

	memSB := create(ctx, t, s, "container")
	run(memSB, "echo memory-file > /home/user/kept.txt && (nohup sleep 4242 >/dev/null 2>&1 &) && cat /home/user/kept.txt", "memory-file")
	if st, b := do(http.MethodPost, "/sandboxes/"+memSB.SandboxID+"/pause", nil); st != http.StatusNoContent {
		t.Fatalf("pause with memory: %d %s", st, b)
	}
	filesSB := create(ctx, t, s, "container")
	run(filesSB, "echo files-file > /home/user/kept.txt && cat /home/user/kept.txt", "files-file")
	if st, b := do(http.MethodPost, "/sandboxes/"+filesSB.SandboxID+"/pause", map[string]any{"memory": false}); st != http.StatusNoContent {
		t.Fatalf("pause files only: %d %s", st, b)
	}

	filler := fill(t, s.DataDir, reserveMB)

	// A restore makes a new sandbox: refused, the snapshot kept.
	st, b = do(http.MethodPost, "/sandboxes", map[string]any{"templateID": snapTemplate, "timeout": 300})
	if st != http.StatusInsufficientStorage || !strings.Contains(string(b), "data disk") || !strings.Contains(string(b), "free space") {
		t.Errorf("restore on a full data disk: %d %s, want 507 naming the data disk and what to free", st, b)
	} else {
		t.Logf("restore: %s", b)
	}
	if st, b := do(http.MethodGet, "/snapshots", nil); st != http.StatusOK || !strings.Contains(string(b), snap.SnapshotID) {
		t.Errorf("the snapshot after a refused restore: %d %s, want it listed", st, b)
	}

	// Resumes give back what is kept.
	for _, r := range []struct {
		name   string
		sb     *wire.Sandbox
		body   map[string]any
		file   string
		memory bool
	}{
		{"memory resume", memSB, map[string]any{"timeout": 300}, "memory-file", true},
		{"files resume", filesSB, map[string]any{"timeout": 300, "memory": false}, "files-file", false},
	} {
		st, b := do(http.MethodPost, "/sandboxes/"+r.sb.SandboxID+"/connect", r.body)
		if st != http.StatusCreated {
			t.Errorf("%s on a full data disk: %d %s, want 201 (a resume makes nothing new)", r.name, st, b)
			if st2, in := getInfo(ctx, t, s, r.sb.SandboxID); st2 != http.StatusOK || in.State != "paused" {
				t.Errorf("after a failed %s: %d %+v, want it still paused", r.name, st2, in)
			}
			continue
		}
		run(r.sb, "cat /home/user/kept.txt", r.file)
		if r.memory {
			run(r.sb, "pgrep -f 'sleep 4242' >/dev/null && echo alive", "alive")
		}
	}

	// Space freed: the snapshot restores.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	st, b = do(http.MethodPost, "/sandboxes", map[string]any{"templateID": snapTemplate, "timeout": 300})
	if st != http.StatusCreated {
		t.Fatalf("restore once space is freed: %d %s", st, b)
	}
	var restored wire.Sandbox
	if err := json.Unmarshal(b, &restored); err != nil {
		t.Fatal(err)
	}
	run(&restored, "cat /home/user/kept.txt", "snapshot-file")

	for _, id := range []string{restored.SandboxID, memSB.SandboxID, filesSB.SandboxID} {
		if err := c.Kill(ctx, id); err != nil {
			t.Errorf("kill %s: %v", id, err)
		}
	}
	if st, b := do(http.MethodDelete, "/templates/"+snapTemplate, nil); st/100 != 2 {
		t.Errorf("delete the snapshot: %d %s", st, b)
	}
	s.WaitNoLeaks(t, before)
}
