// Package desktop_test runs computer use end to end: it builds the binaries
// and the builtin "desktop" template (with the CLI, cached in the shared
// template dir), starts `agentbox serve`, and drives a desktop sandbox with
// the official @e2b/desktop SDK (desktop.test.mjs): display and XFCE
// started by the SDK, screenshots, mouse, keyboard, open, launch and the
// noVNC stream through the gateway.
package desktop_test

import (
	"cmp"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
)

var suite = harness.NewSuite("desktop")

func TestMain(m *testing.M) { os.Exit(suite.Run(m)) }

// TestDesktopSDK runs desktop.test.mjs with @e2b/desktop.
func TestDesktopSDK(t *testing.T) {
	harness.RequireRoot(t)
	if testing.Short() {
		t.Skip("end-to-end tests skipped in -short mode")
	}
	bin, _ := harness.Binaries(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Minute)
	defer cancel()
	// The template first (a no-op when cached; about 3 minutes cold).
	tdir := cmp.Or(os.Getenv("AGENTBOX_TEMPLATE_DIR"), harness.DefaultTemplateDir)
	out, err := exec.CommandContext(ctx, bin, "template", "build", "desktop", "--template-dir", tdir).CombinedOutput()
	if err != nil {
		t.Fatalf("template build desktop: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	t.Logf("template build: %s", lines[len(lines)-1])

	s := suite.Server(t)
	dir := filepath.Join(s.Root, "e2e", "desktop")
	harness.NPMInstall(t, dir)
	harness.SDKMatrix(t, dir, "@e2b/desktop")
	cmd := exec.CommandContext(ctx, "node", "--test", "--test-reporter=spec", "desktop.test.mjs")
	cmd.Dir = dir
	cmd.Env = s.Env(s.APIKey)
	out, err = cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node --test failed: %v\n%s", err, out)
	}
	t.Logf("node --test:\n%s", out)
}
