// Package dashboard_test drives agentbox's web dashboard end to end in
// headless Chromium (Debian's chromium, driven by playwright-core): log in
// with an API key, create a sandbox from the page, type in its terminal and
// read the output, upload and download a file, see the CPU/memory plot and
// the filtered audit log, and check tenant-controlled metadata is shown as
// text. Screenshots go to bin/artefacts/dashboard.
package dashboard_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
)

var suite = harness.NewSuite("dashboard")

func TestMain(m *testing.M) { os.Exit(suite.Run(m)) }

// TestDashboardInChromium runs dashboard.test.mjs.
func TestDashboardInChromium(t *testing.T) {
	s := suite.Server(t)
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("chromium is not installed (scripts/install-deps.sh installs Debian's): %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	dir := filepath.Join(s.Root, "e2e", "dashboard")
	artefacts := filepath.Join(s.Root, "bin", "artefacts", "dashboard")
	if err := os.MkdirAll(artefacts, 0o755); err != nil {
		t.Fatal(err)
	}
	harness.NPMInstall(t, dir)
	cmd := exec.CommandContext(ctx, "node", "--test", "--test-concurrency=1", "--test-reporter=spec", "dashboard.test.mjs")
	cmd.Dir = dir
	cmd.Env = append(s.Env(s.APIKey), "CHROMIUM="+chromium, "ARTEFACTS="+artefacts)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node --test failed: %v\n%s", err, out)
	}
	t.Logf("node --test:\n%s", out)
}
