// Package interpreter_test runs the code interpreter end to end: it builds
// the binaries and the code-interpreter-v1 template (with the CLI, cached in
// the shared template dir), starts `agentbox serve`, and drives it with the
// official @e2b/code-interpreter SDK, agentbox's Go SDK and its CLI. It also
// prints the interpreter's figures (warm runCode p50, first context ready
// after create, memory per idle kernel).
package interpreter_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

const templateName = "code-interpreter-v1"

// suite is the package's one server; its first user builds the template.
var suite = harness.NewSuite("interpreter")

func TestMain(m *testing.M) { os.Exit(suite.Run(m)) }

type server struct{ *harness.Server }

var tpl struct {
	once sync.Once
	err  error
}

// need builds the template (with the CLI, cached in the shared template
// dir; it prints its build time and size) and returns the running server.
func need(t *testing.T) *server {
	t.Helper()
	harness.RequireRoot(t)
	if testing.Short() {
		t.Skip("end-to-end tests skipped in -short mode")
	}
	bin, _ := harness.Binaries(t)
	tpl.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
		defer cancel()
		tdir := cmpOr(os.Getenv("AGENTBOX_TEMPLATE_DIR"), harness.DefaultTemplateDir)
		out, err := exec.CommandContext(ctx, bin, "template", "build", templateName, "--template-dir", tdir).CombinedOutput()
		if err != nil {
			tpl.err = fmt.Errorf("template build: %w\n%s", err, out)
			return
		}
		fmt.Fprintf(os.Stderr, "template build: %s\n", lastLine(string(out)))
	})
	if tpl.err != nil {
		t.Fatal(tpl.err)
	}
	return &server{suite.Server(t)}
}

func (s *server) client() *agentbox.Client {
	return agentbox.New(agentbox.WithAPIURL(s.URL), agentbox.WithSandboxURL(s.URL), agentbox.WithAPIKey(s.APIKey))
}

func (s *server) env() []string { return s.Env(s.APIKey) }

// TestCodeInterpreterSDK runs interpreter.test.mjs with the official
// @e2b/code-interpreter SDK.
func TestCodeInterpreterSDK(t *testing.T) {
	s := need(t)
	ctx, cancel := context.WithTimeout(t.Context(), 40*time.Minute)
	defer cancel()
	dir := filepath.Join(s.Root, "e2e", "interpreter")
	harness.NPMInstall(t, dir)
	harness.SDKMatrix(t, dir, "@e2b/code-interpreter")
	cmd := exec.CommandContext(ctx, "node", "--test", "--test-reporter=spec", "interpreter.test.mjs")
	cmd.Dir = dir
	cmd.Env = s.env()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node --test failed: %v\n%s", err, out)
	}
	t.Logf("node --test:\n%s", out)
}

// TestGoSDKAndCLI drives a sandbox with the Go SDK's RunCode and with
// `agentbox run-code`, which saves a plotted PNG to a file.
func TestGoSDKAndCLI(t *testing.T) {
	s := need(t)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	sbx, err := s.client().Create(ctx, agentbox.CreateOptions{Template: templateName, Timeout: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer sbx.Kill(context.WithoutCancel(ctx))

	var streamed []string
	ex, err := sbx.RunCode(ctx, "import sys\nprint('a'); print('b', file=sys.stderr)\nv = 21\nv * 2", agentbox.RunCodeOptions{
		OnStdout: func(m agentbox.OutputMessage) { streamed = append(streamed, m.Line) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if ex.Text() != "42" || strings.Join(ex.Logs.Stdout, "") != "a\n" || strings.Join(ex.Logs.Stderr, "") != "b\n" || len(streamed) != 1 {
		t.Fatalf("execution %+v", ex)
	}
	ex, err = sbx.RunCode(ctx, "let s: string = 'ts'; s", agentbox.RunCodeOptions{Language: "ts"})
	if err != nil || ex.Text() != "ts" {
		t.Fatalf("ts: %+v %v", ex, err)
	}
	ex, err = sbx.RunCode(ctx, "import time; time.sleep(60)", agentbox.RunCodeOptions{Timeout: time.Second})
	if err != nil || ex.Error == nil || ex.Error.Name != "KeyboardInterrupt" {
		t.Fatalf("timeout: %+v %v", ex, err)
	}
	if ex, err = sbx.RunCode(ctx, "v", agentbox.RunCodeOptions{}); err != nil || ex.Text() != "21" {
		t.Fatalf("state after timeout: %+v %v", ex, err)
	}

	out := t.TempDir()
	cli := exec.CommandContext(ctx, s.Bin, "run-code", sbx.ID, "--lang", "python", "--out-dir", out, "-")
	cli.Env = append(os.Environ(), "AGENTBOX_API_URL="+s.URL, "AGENTBOX_API_KEY="+s.APIKey, "E2B_SANDBOX_URL="+s.URL)
	cli.Stdin = strings.NewReader("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2]); plt.show()\nprint('plotted')\nv + 1\n")
	b, err := cli.CombinedOutput()
	if err != nil {
		t.Fatalf("run-code: %v\n%s", err, b)
	}
	m := regexp.MustCompile(`\[png saved to (\S+)\]`).FindSubmatch(b)
	if m == nil || !strings.Contains(string(b), "plotted\n") || !strings.Contains(string(b), "\n22\n") {
		t.Fatalf("run-code output:\n%s", b)
	}
	f, err := os.Open(string(m[1]))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := png.Decode(f); err != nil {
		t.Fatalf("saved PNG: %v", err)
	}
	cli = exec.CommandContext(ctx, s.Bin, "run-code", sbx.ID, "1/0")
	cli.Env = append(os.Environ(), "AGENTBOX_API_URL="+s.URL, "AGENTBOX_API_KEY="+s.APIKey, "E2B_SANDBOX_URL="+s.URL)
	b, err = cli.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || !bytes.Contains(b, []byte("ZeroDivisionError: division by zero")) {
		t.Fatalf("run-code error: %v\n%s", err, b)
	}
}

// TestFigures measures what the bench asks for and logs it:
// first context ready after create, warm runCode('1+1') p50, idle kernel
// memory. It checks behaviour only; the numbers are for the report.
func TestFigures(t *testing.T) {
	s := need(t)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	c := s.client()
	var ready []time.Duration
	var creates []time.Duration
	for range 3 {
		t0 := time.Now()
		sbx, err := c.Create(ctx, agentbox.CreateOptions{Template: templateName})
		if err != nil {
			t.Fatal(err)
		}
		creates = append(creates, time.Since(t0))
		ex, err := sbx.RunCode(ctx, "1+1", agentbox.RunCodeOptions{})
		if err != nil || ex.Text() != "2" {
			t.Fatalf("first run: %+v %v", ex, err)
		}
		ready = append(ready, time.Since(t0))
		if err := sbx.Kill(ctx); err != nil {
			t.Fatal(err)
		}
	}
	sbx, err := c.Create(ctx, agentbox.CreateOptions{Template: templateName})
	if err != nil {
		t.Fatal(err)
	}
	defer sbx.Kill(context.WithoutCancel(ctx))
	var warm, warmJS []time.Duration
	for i := range 60 {
		t0 := time.Now()
		ex, err := sbx.RunCode(ctx, "1+1", agentbox.RunCodeOptions{})
		if err != nil || ex.Text() != "2" {
			t.Fatalf("run: %+v %v", ex, err)
		}
		if i >= 10 {
			warm = append(warm, time.Since(t0))
		}
		t0 = time.Now()
		if ex, err = sbx.RunCode(ctx, "1+1", agentbox.RunCodeOptions{Language: "js"}); err != nil || ex.Text() != "2" {
			t.Fatalf("js run: %+v %v", ex, err)
		}
		if i >= 10 {
			warmJS = append(warmJS, time.Since(t0))
		}
	}
	// RSS of the idle kernels (the default python and javascript contexts).
	res, err := sbx.Commands.Run(ctx, `ps -eo rss=,args= | grep -E 'ipykernel_launcher|node_kernel.js|envd interpreter' | grep -v grep`, agentbox.WithUser("root"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("create (API) p50 %s; create → first runCode('1+1') answered: %v (p50 %s)", p50(creates), ready, p50(ready))
	t.Logf("warm runCode('1+1') through the gateway: python p50 %s p90 %s, javascript p50 %s p90 %s (n=%d)",
		p50(warm), pct(warm, 90), p50(warmJS), pct(warmJS, 90), len(warm))
	for line := range strings.Lines(strings.TrimSpace(res.Stdout)) {
		f := strings.Fields(line)
		kb, _ := strconv.Atoi(f[0])
		t.Logf("idle RSS %5.1f MB  %s", float64(kb)/1024, strings.Join(f[1:min(len(f), 5)], " "))
	}
}

func p50(d []time.Duration) time.Duration { return pct(d, 50) }

func pct(d []time.Duration, p int) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[(len(s)-1)*p/100].Round(10 * time.Microsecond)
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
