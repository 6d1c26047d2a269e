package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
)

func TestSplitRemote(t *testing.T) {
	tests := []struct {
		arg, id, path string
		remote        bool
	}{
		{"iabc:/tmp/x", "iabc", "/tmp/x", true},
		{"iabc:rel/x", "iabc", "rel/x", true},
		{"iabc:", "iabc", "", true},
		{"./a:b", "", "./a:b", false},
		{"/abs/x", "", "/abs/x", false},
		{"file", "", "file", false},
		{":x", "", ":x", false},
		{"-", "", "-", false},
	}
	for _, tt := range tests {
		id, p, remote := splitRemote(tt.arg)
		if id != tt.id || p != tt.path || remote != tt.remote {
			t.Errorf("splitRemote(%q) = %q %q %v", tt.arg, id, p, remote)
		}
	}
}

func TestCommandLine(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"echo $HOME | wc"}, "echo $HOME | wc"},
		{[]string{"ls", "-la", "/tmp"}, "ls -la /tmp"},
		{[]string{"echo", "a b", "it's", "$X"}, `echo 'a b' 'it'\''s' '$X'`},
		{[]string{"printf", ""}, "printf ''"},
	}
	for _, tt := range tests {
		if got := commandLine(tt.args); got != tt.want {
			t.Errorf("commandLine(%q) = %s, want %s", tt.args, got, tt.want)
		}
	}
}

func TestParsePairs(t *testing.T) {
	m, err := parsePairs("env", []string{"A=1", "B=x=y", "C="})
	if err != nil || m["A"] != "1" || m["B"] != "x=y" || m["C"] != "" {
		t.Errorf("parsePairs = %v, %v", m, err)
	}
	for _, bad := range []string{"novalue", "=v"} {
		if _, err := parsePairs("env", []string{bad}); err == nil || !strings.Contains(err.Error(), "--env") {
			t.Errorf("parsePairs(%q) = %v, want an error naming the flag", bad, err)
		}
	}
}

// run executes the CLI against a fake control plane and returns stdout and
// the error main would print.
func run(t *testing.T, handler http.HandlerFunc, args ...string) (string, error) {
	t.Helper()
	srv := httptest.NewServer(handler)
	t.Cleanup(srv.Close)
	t.Setenv("AGENTBOX_API_KEY", "")
	t.Setenv("E2B_API_KEY", "")
	t.Setenv("AGENTBOX_DATA_DIR", t.TempDir())
	root := newRootCmd()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(append([]string{"--api-url", srv.URL, "--api-key", "e2b_k"}, args...))
	err := root.Execute()
	return out.String(), err
}

func TestCreateAndKill(t *testing.T) {
	var body map[string]any
	out, err := run(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v2/sandboxes" || r.Header.Get("X-API-Key") != "e2b_k" {
			t.Errorf("%s %s key %q", r.Method, r.URL.Path, r.Header.Get("X-API-Key"))
		}
		_ = json.NewDecoder(r.Body).Decode(&body)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"sandboxID":"inew","templateID":"t1","clientID":"x","envdVersion":"0.6.13"}`))
	}, "create", "py", "--timeout", "90s", "--metadata", "owner=alice", "--env", "A=1")
	if err != nil || out != "inew\n" {
		t.Fatalf("create: %q, %v", out, err)
	}
	if body["templateID"] != "py" || body["timeout"] != 90.0 ||
		body["metadata"].(map[string]any)["owner"] != "alice" || body["envVars"].(map[string]any)["A"] != "1" {
		t.Errorf("create body = %v", body)
	}

	out, err = run(t, func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/igone") {
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"code":404,"message":"Sandbox \"igone\" doesn't exist or you don't have access to it"}`))
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}, "kill", "ia", "igone", "ib")
	if out != "ia\nib\n" {
		t.Errorf("kill printed %q", out)
	}
	if err == nil || !strings.Contains(err.Error(), `Sandbox "igone" doesn't exist`) {
		t.Errorf("kill error = %v", err)
	}
}

func TestLocalAPIKey(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("AGENTBOX_DATA_DIR", dir)
	if got := localAPIKey(); got != "" {
		t.Errorf("no file: %q", got)
	}
	if err := writeFile(dir+"/apikey", "e2b_abc\n"); err != nil {
		t.Fatal(err)
	}
	if got := localAPIKey(); got != "e2b_abc" {
		t.Errorf("key = %q", got)
	}
}

func writeFile(p, s string) error { return os.WriteFile(p, []byte(s), 0o600) }
