// Package e2e holds black-box end-to-end tests: they build the real binaries,
// run `agentbox serve` on a free port, and drive it with the official E2B JS
// SDK, agentbox's Go SDK and CLI, and raw protocol calls.
package e2e

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
)

// TestJSSDK runs e2e/js with the official e2b SDK (2.51.0 and 2.50.0).
func TestJSSDK(t *testing.T) {
	s := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	jsDir := filepath.Join(s.Root, "e2e", "js")
	harness.NPMInstall(t, jsDir)
	cmd := exec.CommandContext(ctx, "node", "--test", "--test-concurrency=1", "--test-reporter=spec", ".")
	cmd.Dir = jsDir
	cmd.Env = s.env()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node --test failed: %v\n%s", err, out)
	}
	t.Logf("node --test:\n%s", lastLines(string(out), 12))
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
