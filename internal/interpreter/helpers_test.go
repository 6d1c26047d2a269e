package interpreter

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// Tests run the real runtimes on the host (scripts/install-deps.sh installs
// them); a missing one skips the tests that need it.
func requirePython(t *testing.T) {
	t.Helper()
	if err := exec.Command("/usr/bin/python3", "-c", "import ipykernel, matplotlib, pandas").Run(); err != nil {
		t.Skip("needs /usr/bin/python3 with ipykernel, matplotlib and pandas (apt-get install python3-ipykernel python3-matplotlib python3-pandas)")
	}
}

func requireNode(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("needs node")
	}
}

func requireR(t *testing.T) {
	t.Helper()
	if err := exec.Command("R", "--slave", "-e", "library(IRkernel)").Run(); err != nil {
		t.Skip("needs R with IRkernel (apt-get install r-cran-irkernel)")
	}
}

func requireJava(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("jshell"); err != nil {
		t.Skip("needs a JDK with jshell (apt-get install default-jdk-headless)")
	}
}

// newTestServer starts an interpreter with no default contexts behind
// httptest; every test gets its own state dir and cwd.
func newTestServer(t *testing.T, langs ...string) (*Server, *httptest.Server) {
	t.Helper()
	if langs == nil {
		langs = []string{}
	}
	s, err := New(Options{
		Logger:           slog.New(slog.NewTextHandler(io.Discard, nil)),
		StateDir:         t.TempDir(),
		Cwd:              t.TempDir(),
		KernelLog:        io.Discard,
		DefaultLanguages: langs,
		MaxOutputBytes:   1 << 20,
	})
	if err != nil {
		t.Fatal(err)
	}
	s.Start(t.Context())
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
		s.Close()
	})
	return s, hs
}

// execution is a parsed /execute stream.
type execution struct {
	Count   int
	Stdout  []string
	Stderr  []string
	Results []map[string]any
	Errors  []map[string]any
	Lines   []map[string]any
	Raw     []string // the NDJSON lines as sent, to check number formats
	Ended   bool
}

func (e *execution) stdout() string { return strings.Join(e.Stdout, "") }
func (e *execution) stderr() string { return strings.Join(e.Stderr, "") }

func (e *execution) mainText() string {
	for _, r := range e.Results {
		if r["is_main_result"] == true {
			s, _ := r["text"].(string)
			return s
		}
	}
	return ""
}

// lastText is the text of the last result, main or displayed.
func (e *execution) lastText() string {
	if len(e.Results) == 0 {
		return ""
	}
	s, _ := e.Results[len(e.Results)-1]["text"].(string)
	return s
}

func (e *execution) errName() string {
	if len(e.Errors) == 0 {
		return ""
	}
	return e.Errors[0]["name"].(string)
}

func run(t *testing.T, hs *httptest.Server, body map[string]any) *execution {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	return runCtx(ctx, t, hs, body)
}

func runCtx(ctx context.Context, t *testing.T, hs *httptest.Server, body map[string]any) *execution {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, hs.URL+"/execute", bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	resp, err := hs.Client().Do(req)
	if err != nil {
		t.Fatalf("execute: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(resp.Body)
		t.Fatalf("execute: %s: %s", resp.Status, msg)
	}
	return readExecution(t, resp.Body)
}

func readExecution(t *testing.T, r io.Reader) *execution {
	t.Helper()
	e := &execution{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("bad NDJSON line %q: %v", sc.Text(), err)
		}
		e.Lines = append(e.Lines, m)
		e.Raw = append(e.Raw, sc.Text())
		switch m["type"] {
		case "number_of_executions":
			e.Count = int(m["execution_count"].(float64))
		case "stdout":
			e.Stdout = append(e.Stdout, m["text"].(string))
		case "stderr":
			e.Stderr = append(e.Stderr, m["text"].(string))
		case "result":
			e.Results = append(e.Results, m)
		case "error":
			e.Errors = append(e.Errors, m)
		case "end_of_execution":
			e.Ended = true
		}
	}
	if err := sc.Err(); err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("read stream: %v", err)
	}
	return e
}

// call does a JSON request and decodes the answer into out (if not nil).
func call(t *testing.T, hs *httptest.Server, method, path string, body any, out any) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequestWithContext(t.Context(), method, hs.URL+path, rd)
	resp, err := hs.Client().Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: decode %q: %v", method, path, b, err)
		}
	}
	return resp.StatusCode, string(b)
}

func createContext(t *testing.T, hs *httptest.Server, language, cwd string) string {
	t.Helper()
	var c struct{ ID, Language, Cwd string }
	code, msg := call(t, hs, http.MethodPost, "/contexts", map[string]string{"language": language, "cwd": cwd}, &c)
	if code != http.StatusOK {
		t.Fatalf("create %s context: %d %s", language, code, msg)
	}
	return c.ID
}

func TestMain(m *testing.M) {
	// Kernels inherit the environment: keep the host's MPLBACKEND etc. out.
	os.Unsetenv("MPLBACKEND")
	os.Exit(m.Run())
}
