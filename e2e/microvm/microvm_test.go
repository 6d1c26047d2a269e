// Package microvm holds the end-to-end tests of the microvm isolation tier:
// sandboxes in QEMU microVMs (under TCG where KVM does not boot guests)
// driven by the official e2b JS SDK.
package microvm

import (
	"context"
	"encoding/json"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
)

// TestJSSDK runs e2e/js/microvm-tier.mjs (commands, files, PTY) against a
// microvm sandbox.
func TestJSSDK(t *testing.T) {
	s := harness.Start(t)
	jsDir := filepath.Join(s.Root, "e2e", "js")
	harness.NPMInstall(t, jsDir)
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "--test", "--test-reporter=spec", "microvm-tier.mjs")
	cmd.Dir = jsDir
	cmd.Env = s.Env(s.APIKey)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node --test microvm-tier.mjs: %v\n%s\nserver log:\n%s", err, out, s.LogTail(40))
	}
	t.Logf("%s", out)
}

// TestFilesystemSnapshotRestore: a sandbox restored from a microVM's
// files-only snapshot boots its disk copy with its own network settings,
// which the server writes into the guest-written disk with e2fsck and
// debugfs confined (internal/confine): the restored guest answers on its
// new address, so the confined edit took.
func TestFilesystemSnapshotRestore(t *testing.T) {
	s := harness.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Minute)
	defer cancel()
	create := func(what string, body map[string]any) string {
		t.Helper()
		st, b, err := s.Do(ctx, s.APIKey, http.MethodPost, "/v2/sandboxes", body)
		if err != nil || st != http.StatusCreated {
			t.Fatalf("%s: %d %s %v\nserver log:\n%s", what, st, b, err, s.LogTail(40))
		}
		var r struct{ SandboxID string }
		if err := json.Unmarshal(b, &r); err != nil || r.SandboxID == "" {
			t.Fatalf("%s: %s %v", what, b, err)
		}
		t.Cleanup(func() {
			_, _, _ = s.Do(context.Background(), s.APIKey, http.MethodDelete, "/sandboxes/"+r.SandboxID, nil)
		})
		return r.SandboxID
	}
	src := create("create a microvm sandbox", map[string]any{"templateID": "base", "timeout": 900,
		"metadata": map[string]string{"agentbox.isolation": "microvm"}})
	st, b, err := s.Do(ctx, s.APIKey, http.MethodPost, "/sandboxes/"+src+"/snapshots", map[string]any{"memory": false})
	if err != nil || st != http.StatusCreated {
		t.Fatalf("files-only snapshot: %d %s %v\nserver log:\n%s", st, b, err, s.LogTail(40))
	}
	var snap struct{ SnapshotID string }
	if err := json.Unmarshal(b, &snap); err != nil || snap.SnapshotID == "" {
		t.Fatalf("snapshot: %s %v", b, err)
	}
	id, _, _ := strings.Cut(snap.SnapshotID, ":")
	create("restore the snapshot", map[string]any{"templateID": id, "timeout": 300})
}
