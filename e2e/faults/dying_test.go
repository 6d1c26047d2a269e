package faults

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
	"github.com/agentbox/agentbox/e2e/wire"
	"github.com/agentbox/agentbox/internal/hostkey"
	"github.com/agentbox/agentbox/internal/runtime/bundle"
)

// info is what the tests read of GET /sandboxes/{id}.
type info struct {
	State        string `json:"state"`
	Health       string `json:"health"`
	HealthReason string `json:"healthReason"`
}

func create(ctx context.Context, t *testing.T, s *harness.Server, isolation string) *wire.Sandbox {
	t.Helper()
	st, b, err := s.Do(ctx, s.APIKey, http.MethodPost, "/sandboxes", map[string]any{"templateID": "base", "timeout": 600, "isolation": isolation})
	if err != nil || st != http.StatusCreated {
		t.Fatalf("create (%s): %d %s %v", isolation, st, b, err)
	}
	var sb wire.Sandbox
	if err := json.Unmarshal(b, &sb); err != nil {
		t.Fatal(err)
	}
	return &sb
}

func getInfo(ctx context.Context, t *testing.T, s *harness.Server, id string) (int, info) {
	t.Helper()
	st, b, err := s.Do(ctx, s.APIKey, http.MethodGet, "/sandboxes/"+id, nil)
	if err != nil {
		t.Fatalf("GET /sandboxes/%s: %v", id, err)
	}
	var in info
	if st == http.StatusOK {
		if err := json.Unmarshal(b, &in); err != nil {
			t.Fatal(err)
		}
	}
	return st, in
}

// statePID asks the OCI runtime for sandbox id's pid: runc's container init
// (envd), runsc's sandbox process (the sentry). Containers are named by the
// sandbox's host key.
func statePID(s *harness.Server, bin, root string) func(t *testing.T, id string) int {
	return func(t *testing.T, id string) int {
		t.Helper()
		key, err := bundle.HostKey(filepath.Join(s.DataDir, "sandboxes"), id)
		if err != nil {
			t.Fatalf("host key of %s: %v", id, err)
		}
		out, err := exec.Command(bin, "--root", root, "state", key).Output()
		if err != nil {
			t.Fatalf("%s --root %s state %s: %v", bin, root, id, err)
		}
		var st struct {
			Pid int `json:"pid"`
		}
		if err := json.Unmarshal(out, &st); err != nil || st.Pid <= 0 {
			t.Fatalf("%s state %s: %s %v", bin, id, out, err)
		}
		return st.Pid
	}
}

// TestDyingPiece kills one piece of a running sandbox from the host
// (kill -9) while a command streams from it, for each piece and tier: the
// stream ends with an error instead of hanging, the sandbox shows health
// "error" with the reason (its E2B state stays one the SDKs know), and its
// owner can kill it, which frees it.
func TestDyingPiece(t *testing.T) {
	s := harness.Start(t, harness.Name("faults-dying"), harness.Args("--health-interval", "1s"))
	run := "/run/" + s.Instance
	for _, tc := range []struct {
		name      string
		isolation string
		pid       func(t *testing.T, id string) int
	}{
		{"runc container init (envd)", "container", statePID(s, "runc", run+"/runc")},
		{"gvisor sentry", "gvisor", statePID(s, "runsc", run+"/runc-runsc")},
		{"gvisor gofer", "gvisor", goferPID(s)},
		{"microvm QEMU", "microvm", qemuPID(s)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			c := wire.New(s.URL, s.APIKey)
			sb := create(ctx, t, s, tc.isolation)

			// A command that streams until the sandbox dies.
			streamEnd := make(chan error, 1)
			go func() {
				r, err := c.Run(ctx, sb, "", "while true; do echo tick; sleep 1; done")
				if err == nil {
					err = fmt.Errorf("the command ended normally: %+v", r)
				}
				streamEnd <- err
			}()
			for {
				r, err := c.Run(ctx, sb, "", "pgrep -f 'sleep 1' >/dev/null")
				if err == nil && r.ExitCode == 0 {
					break
				}
				if ctx.Err() != nil {
					t.Fatal("the streaming command never started")
				}
			}
			if err := syscall.Kill(tc.pid(t, sb.SandboxID), syscall.SIGKILL); err != nil {
				t.Fatalf("kill -9: %v", err)
			}
			select {
			case err := <-streamEnd:
				t.Logf("the stream ended with: %v", err)
			case <-ctx.Done():
				t.Fatal("the stream of a dead sandbox hangs")
			}
			var last info
			for {
				st, in := getInfo(ctx, t, s, sb.SandboxID)
				if st == http.StatusOK && in.Health == "error" && in.HealthReason != "" {
					last = in
					break
				}
				if ctx.Err() != nil {
					t.Fatalf("never reported: %d %+v", st, in)
				}
				time.Sleep(200 * time.Millisecond)
			}
			if last.State != "running" && last.State != "paused" {
				t.Errorf("state %q is not one the E2B SDKs know", last.State)
			}
			t.Logf("reported: %s", last.HealthReason)
			list, err := c.List(ctx, nil)
			if err != nil {
				t.Fatalf("list: %v", err)
			}
			if !strings.Contains(fmt.Sprint(list), sb.SandboxID) {
				t.Errorf("the dead sandbox is missing from the list: %+v", list)
			}
			if err := c.Kill(ctx, sb.SandboxID); err != nil {
				t.Fatalf("kill a dead sandbox: %v", err)
			}
			if st, _ := getInfo(ctx, t, s, sb.SandboxID); st != http.StatusNotFound {
				t.Errorf("after kill: %d, want 404", st)
			}
			var werr *wire.Error
			if _, err := c.Run(ctx, sb, "", "true"); err == nil || (errors.As(err, &werr) && werr.Status/100 == 2) {
				t.Errorf("a command in a killed sandbox: %v", err)
			}
		})
	}
}

// goferPID finds the gofer of sandbox id's gVisor container: the runsc
// process serving its files, named by the bundle (the host key) in its
// command line.
func goferPID(s *harness.Server) func(t *testing.T, id string) int {
	return func(t *testing.T, id string) int {
		t.Helper()
		key, err := bundle.HostKey(filepath.Join(s.DataDir, "sandboxes"), id)
		if err != nil {
			t.Fatalf("host key of %s: %v", id, err)
		}
		procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
		for _, p := range procs {
			b, err := os.ReadFile(p)
			if err != nil {
				continue
			}
			args := strings.Split(string(b), "\x00")
			if !slices.Contains(args, "gofer") || !strings.Contains(string(b), key) {
				continue
			}
			if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p))); err == nil {
				return pid
			}
		}
		t.Fatalf("no gofer process names %s", key)
		return 0
	}
}

// qemuPID reads the pid file of sandbox id's QEMU.
func qemuPID(s *harness.Server) func(t *testing.T, id string) int {
	return func(t *testing.T, id string) int {
		t.Helper()
		state := filepath.Join(s.DataDir, "microvm")
		keys, err := hostkey.Read(filepath.Join(state, ".hostkey"))
		if err != nil {
			t.Fatalf("microvm host key: %v", err)
		}
		b, err := os.ReadFile(filepath.Join(state, keys.Key(id), "qemu.pid"))
		if err != nil {
			t.Fatalf("QEMU pid file of %s: %v", id, err)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatalf("QEMU pid file of %s: %q", id, b)
		}
		return pid
	}
}
