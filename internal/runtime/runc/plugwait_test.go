package runc

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/agentbox/agentbox/internal/testutil"
)

// The restore's network hook hands the OCI state's pid to the server,
// which plugs it, and exits with the server's answer: run as runc runs it
// (the test binary, whose nsjoin constructor answers it without the Go
// runtime); malformed calls reach the Go side, which names the problem.
func TestPlugWaitHook(t *testing.T) {
	long := filepath.Join(t.TempDir(), strings.Repeat("d", 120))
	if err := os.Mkdir(long, 0o700); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		dir     string
		state   string
		plugErr error
		wantErr string // "" for success
		wantPid int
	}{
		{name: "plugged", dir: t.TempDir(), state: `{"ociVersion":"1.0.2","id":"x","status":"creating","pid":4242,"bundle":"/b"}`, wantPid: 4242},
		{name: "socket path longer than an address", dir: long, state: `{"pid":4244}`, wantPid: 4244},
		{name: "plug fails", dir: t.TempDir(), state: `{"pid":4245}`, plugErr: errors.New("no veth today"), wantErr: "no veth today", wantPid: 4245},
		{name: "no pid", dir: t.TempDir(), state: `{"id":"x"}`, wantErr: "names no pid"},
		{name: "not JSON", dir: t.TempDir(), state: `pid=1`, wantErr: "OCI state"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var plugged []int
			w, err := listenPlug(context.Background(), tt.dir, func(_ context.Context, pid int) error {
				plugged = append(plugged, pid)
				return tt.plugErr
			})
			if err != nil {
				t.Fatal(err)
			}
			defer w.close()
			if fi, err := os.Stat(w.path); err != nil || fi.Mode().Perm() != 0o600 {
				t.Fatalf("socket %s: %v, %v; want mode 0600", w.path, fi, err)
			}
			var stderr bytes.Buffer
			cmd := exec.Command(testHookBinary(t), "__hook", PlugWaitHook, "--socket", w.path)
			cmd.Stdin, cmd.Stderr = strings.NewReader(tt.state), &stderr
			herr := cmd.Run()
			if tt.wantErr == "" && herr != nil {
				t.Fatalf("hook: %v: %s", herr, stderr.String())
			}
			if tt.wantErr != "" && (herr == nil || !strings.Contains(herr.Error()+stderr.String(), tt.wantErr)) {
				t.Fatalf("hook: %v: %q; want a failure naming %q", herr, stderr.String(), tt.wantErr)
			}
			r, ok := w.result()
			if !ok {
				t.Fatal("no result after the hook returned")
			}
			if r.pid != tt.wantPid || (r.err == nil) != (tt.wantErr == "") {
				t.Fatalf("result %+v, want pid %d, error %q", r, tt.wantPid, tt.wantErr)
			}
			if tt.wantPid != 0 && (len(plugged) != 1 || plugged[0] != tt.wantPid) {
				t.Fatalf("plugged %v, want [%d]", plugged, tt.wantPid)
			}
			w.close()
			if _, err := os.Stat(w.path); !os.IsNotExist(err) {
				t.Fatalf("socket left after close: %v", err)
			}
		})
	}
}

// Nobody but the host's root gets a netns plugged through the socket.
func TestPlugWaitHookRefusesOtherUsers(t *testing.T) {
	testutil.RequireRoot(t)
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	called := false
	w, err := listenPlug(context.Background(), dir, func(context.Context, int) error { called = true; return nil })
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	// Past the socket's mode (0600), the server checks who connected: a
	// copy of the hook anyone may run, on a socket anyone may reach.
	b, err := os.ReadFile(testHookBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	hook := filepath.Join(dir, "hook")
	if err := os.WriteFile(hook, b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(w.path, 0o666); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(hook, "__hook", PlugWaitHook, "--socket", w.path)
	cmd.Stdin = strings.NewReader(`{"pid":1}`)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	// The server hangs up on it, before or after it sent the state.
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("hook as nobody succeeded: %s", out)
	}
	if !strings.Contains(string(out), "without an answer") && !strings.Contains(string(out), "send the OCI state") {
		t.Fatalf("hook as nobody: %v: %s; want the server to hang up on it", err, out)
	}
	if _, ok := w.result(); ok || called {
		t.Fatal("a request from another user reached the plug")
	}
}

// Calls the constructor does not act on reach Go, which never does the
// hook's work but says what is wrong.
func TestPlugWaitHookMalformed(t *testing.T) {
	for _, args := range [][]string{nil, {"--socket"}, {"--socket", "/x", "extra"}, {"--socket=/x"}} {
		if err := RunPlugWaitHook(args); err == nil {
			t.Errorf("RunPlugWaitHook(%q) = nil, want an error", args)
		}
	}
}
