// Package e2e holds black-box end-to-end tests: they build the real binaries,
// run `agentbox serve` on a free port, and drive it with the official E2B JS
// SDK, agentbox's Go SDK and CLI, and raw protocol calls.
package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
)

// TestJSSDK runs e2e/js with the official e2b SDK, once per pinned version
// (each test file imports one: e2b is 2.51.0, e2b-250 is 2.50.0).
// E2E_JS_TEST_NAME_PATTERN runs only the JS tests whose names match.
func TestJSSDK(t *testing.T) {
	s := need(t)
	jsDir := filepath.Join(s.Root, "e2e", "js")
	harness.NPMInstall(t, jsDir)
	for _, v := range []struct{ file, module string }{
		{"sdk-2.51.test.mjs", "e2b"},
		{"sdk-2.50.test.mjs", "e2b-250"},
	} {
		t.Run(v.module, func(t *testing.T) {
			harness.SDKMatrix(t, jsDir, v.module)
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Minute)
			defer cancel()
			args := []string{"--test", "--test-reporter=spec"}
			if p := os.Getenv("E2E_JS_TEST_NAME_PATTERN"); p != "" {
				// Runs only the JS tests whose names match (node's
				// --test-name-pattern), e.g. while working on one.
				args = append(args, "--test-name-pattern="+p)
			}
			cmd := exec.CommandContext(ctx, "node", append(args, v.file)...)
			cmd.Dir = jsDir
			cmd.Env = s.env()
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("node --test %s failed: %v\n%s", v.file, err, out)
			}
			t.Logf("node --test %s:\n%s", v.file, lastLines(string(out), 12))
		})
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
