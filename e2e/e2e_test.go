// Package e2e holds black-box end-to-end tests: they build the real binaries,
// run `agentbox serve` on a free port, and drive it with the official E2B JS
// SDK, agentbox's Go SDK and CLI, and raw protocol calls.
package e2e

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/testutil"
)

// defaultTemplateDir is shared by every run on a machine so the base template
// is built once.
const defaultTemplateDir = "/var/cache/agentbox/templates"

// srv is the server every test talks to; set once by TestMain.
var (
	srv    *server
	srvErr error
)

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() || (os.Geteuid() != 0 && os.Getenv("AGENTBOX_REQUIRE_ROOT") != "1") {
		os.Exit(m.Run()) // tests skip themselves in need()
	}
	srv, srvErr = setup()
	code := m.Run()
	if srv != nil {
		teardown(srv)
		if code != 0 {
			fmt.Fprintf(os.Stderr, "\n----- agentbox serve log (%s), last 300 lines -----\n%s\n", srv.logPath, srv.logTail(300))
		}
	}
	os.Exit(code)
}

func setup() (*server, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	root, err := repoRoot()
	if err != nil {
		return nil, err
	}
	if err := build(ctx, root); err != nil {
		return nil, err
	}
	tdir := os.Getenv("AGENTBOX_TEMPLATE_DIR")
	if tdir == "" {
		tdir = defaultTemplateDir
	}
	if err := os.MkdirAll(tdir, 0o755); err != nil {
		return nil, err
	}
	data, err := os.MkdirTemp("", "agentbox-e2e-data-")
	if err != nil {
		return nil, err
	}
	logf, err := os.CreateTemp("", "agentbox-e2e-serve-*.log")
	if err != nil {
		return nil, err
	}
	logf.Close()
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	s := &server{
		root:        root,
		bin:         filepath.Join(root, "bin", "agentbox"),
		envd:        filepath.Join(root, "bin", "envd"),
		dataDir:     data,
		templateDir: tdir,
		addr:        addr,
		logPath:     logf.Name(),
		instance:    "agentbox-e2e",
	}
	if err := s.start(ctx); err != nil {
		return s, fmt.Errorf("%w\n--- serve log ---\n%s", err, s.logTail(100))
	}
	if s.otherKey, err = s.createKey(ctx, "other"); err != nil {
		return s, err
	}
	return s, nil
}

// teardown kills whatever sandboxes the tests left, then stops the server
// gracefully. The data dir is removed only when nothing is mounted under it.
func teardown(s *server) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if s.cmd != nil && s.cmd.ProcessState == nil {
		for _, key := range []string{s.apiKey, s.otherKey} {
			if key == "" {
				continue
			}
			c := s.client()
			c.APIKey = key
			list, _ := c.List(ctx, nil)
			for _, sb := range list {
				_ = c.Kill(ctx, sb.SandboxID)
			}
		}
		_ = s.stop(syscall.SIGTERM)
	}
	if mounts, err := mountsUnder(s.dataDir); err == nil && len(mounts) == 0 {
		_ = os.RemoveAll(s.dataDir)
	} else {
		fmt.Fprintf(os.Stderr, "e2e: keeping %s, still mounted: %v\n", s.dataDir, mounts)
	}
}

// need gates a test on root and on a running server.
func need(t *testing.T) *server {
	t.Helper()
	testutil.RequireRoot(t)
	if testing.Short() {
		t.Skip("end-to-end tests skipped in -short mode")
	}
	if srvErr != nil {
		t.Fatalf("server setup: %v", srvErr)
	}
	if srv == nil {
		t.Fatal("server not started")
	}
	return srv
}

// TestJSSDK runs e2e/js with the official e2b SDK (2.51.0 and 2.50.0).
func TestJSSDK(t *testing.T) {
	s := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	jsDir := filepath.Join(s.root, "e2e", "js")
	if _, err := os.Stat(filepath.Join(jsDir, "node_modules", "e2b")); err != nil {
		npm := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund")
		npm.Dir = jsDir
		if out, err := npm.CombinedOutput(); err != nil {
			t.Fatalf("npm ci: %v\n%s", err, out)
		}
	}
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
