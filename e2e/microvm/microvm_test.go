// Package microvm holds the end-to-end tests of the microvm isolation tier:
// sandboxes in QEMU microVMs (under TCG where KVM does not boot guests)
// driven by the official e2b JS SDK.
package microvm

import (
	"context"
	"os/exec"
	"path/filepath"
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
