package agentbox

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api/gen/rest"
	"github.com/agentbox/agentbox/internal/interpreter"
)

// codeSandbox is a Sandbox whose data plane is a real code interpreter
// (no gateway: the interpreter ignores the routing headers).
func codeSandbox(t *testing.T, langs ...string) *Sandbox {
	t.Helper()
	srv, err := interpreter.New(interpreter.Options{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), StateDir: t.TempDir(), Cwd: t.TempDir(),
		KernelLog: io.Discard, DefaultLanguages: append([]string{}, langs...),
	})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() { hs.CloseClientConnections(); hs.Close(); srv.Close() })
	c := New(WithAPIURL(hs.URL), WithSandboxURL(hs.URL), WithAPIKey("unused"))
	return c.newSandbox(rest.Sandbox{SandboxID: "itest"})
}

// TestRunCodeResponseLimit: an answer past MaxResponseBytes ends RunCode
// with ErrResponseTooLarge instead of being read whole.
func TestRunCodeResponseLimit(t *testing.T) {
	sbx := codeSandbox(t)
	_, err := sbx.RunCode(t.Context(), "head -c 200000 /dev/zero | tr '\\0' x", RunCodeOptions{Language: "bash", MaxResponseBytes: 50000})
	if !errors.Is(err, ErrResponseTooLarge) {
		t.Fatalf("err = %v, want ErrResponseTooLarge", err)
	}
	// The same shell: the cut-off run's interrupt must not reach this one.
	ex, err := sbx.RunCode(t.Context(), "echo small", RunCodeOptions{Language: "bash", MaxResponseBytes: 50000})
	if err != nil || strings.Join(ex.Logs.Stdout, "") != "small\n" {
		t.Fatalf("within the limit: %+v %v", ex, err)
	}
}

func TestRunCodeBash(t *testing.T) {
	sbx := codeSandbox(t)
	ctx := t.Context()
	var streamed []string
	ex, err := sbx.RunCode(ctx, "n=6; echo $((n*7)); echo warn >&2", RunCodeOptions{
		Language: "bash", OnStdout: func(m OutputMessage) { streamed = append(streamed, m.Line) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(ex.Logs.Stdout, "") != "42\n" || strings.Join(ex.Logs.Stderr, "") != "warn\n" || len(streamed) == 0 || ex.ExecutionCount != 1 {
		t.Errorf("execution %+v streamed %q", ex, streamed)
	}
	ex, err = sbx.RunCode(ctx, "echo $n; exit_code_test() { return 3; }; exit_code_test", RunCodeOptions{Language: "bash"})
	if err != nil || ex.Logs.Stdout[0] != "6\n" || ex.Error == nil || ex.Error.Name != "ExitError" {
		t.Errorf("state or error: %+v %v", ex, err)
	}

	c, err := sbx.CreateCodeContext(ctx, CodeContextOptions{Language: "bash", Cwd: "/"})
	if err != nil {
		t.Fatal(err)
	}
	ex, err = sbx.RunCode(ctx, "pwd; echo ${n:-unset}", RunCodeOptions{ContextID: c.ID})
	if err != nil || strings.Join(ex.Logs.Stdout, "") != "/\nunset\n" {
		t.Errorf("own context: %+v %v", ex, err)
	}
	list, err := sbx.ListCodeContexts(ctx)
	if err != nil || len(list) != 2 || list[1].ID != c.ID {
		t.Errorf("list %+v %v", list, err)
	}
	if err := sbx.RestartCodeContext(ctx, c.ID); err != nil {
		t.Error(err)
	}
	if err := sbx.RemoveCodeContext(ctx, c.ID); err != nil {
		t.Error(err)
	}
	if err := sbx.RemoveCodeContext(ctx, c.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("second remove: %v", err)
	}
	if _, err := sbx.RunCode(ctx, "1", RunCodeOptions{Language: "cobol"}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "python, javascript") {
		t.Errorf("unknown language: %v", err)
	}
	start := time.Now()
	ex, err = sbx.RunCode(ctx, "sleep 60", RunCodeOptions{Language: "bash", Timeout: 500 * time.Millisecond})
	if err != nil || ex.Error == nil || time.Since(start) > 20*time.Second {
		t.Errorf("timeout: %+v %v after %s", ex, err, time.Since(start))
	}
}

func TestRunCodePython(t *testing.T) {
	if exec.Command("/usr/bin/python3", "-c", "import ipykernel, matplotlib").Run() != nil {
		t.Skip("needs python3-ipykernel and python3-matplotlib")
	}
	sbx := codeSandbox(t, "python")
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var results []Result
	ex, err := sbx.RunCode(ctx, "import matplotlib.pyplot as plt\nplt.plot([1, 2]); plt.show()\n6 * 7", RunCodeOptions{
		OnResult: func(r Result) { results = append(results, r) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if ex.Text() != "42" || len(ex.Results) != 2 || ex.Results[0].PNG == "" || len(ex.Results[0].Chart) == 0 || len(results) != 2 {
		t.Fatalf("execution %+v", ex)
	}
	if f := ex.Results[0].Formats(); !strings.Contains(strings.Join(f, ","), "png") {
		t.Errorf("formats %v", f)
	}
	ex, err = sbx.RunCode(ctx, "raise ValueError('bad')", RunCodeOptions{})
	if err != nil || ex.Error == nil || ex.Error.Name != "ValueError" || ex.Error.Value != "bad" || !strings.Contains(ex.Error.Traceback, "ValueError") {
		t.Errorf("error %+v %v", ex.Error, err)
	}
}
