// Package lifecycle holds the end-to-end tests of pause/resume, snapshots,
// forks, warm pools and crash-safe transitions against the real server.
package lifecycle

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
)

// server is the harness's server with the test whose failures it reports
// (set to the subtest in table tests).
type server struct {
	*harness.Server
	t *testing.T
}

// newServer starts a server for t; tests restart it with their own flags.
func newServer(t *testing.T) *server {
	t.Helper()
	return &server{Server: harness.Start(t), t: t}
}

// start launches the stopped server; extra flags (e.g. --fault-step) apply
// to this run.
func (s *server) start(extra ...string) {
	s.t.Helper()
	s.Launch(s.t, extra...)
}

func (s *server) stop(sig syscall.Signal) {
	s.t.Helper()
	if sig == syscall.SIGKILL {
		s.Kill9(s.t)
		return
	}
	s.Terminate(s.t)
}

// waitExit waits for a fault-injected exit.
func (s *server) waitExit(d time.Duration) bool {
	select {
	case <-s.Exited():
		return true
	case <-time.After(d):
		return false
	}
}

func (s *server) do(method, path string, body any, hdr map[string]string) (int, []byte) {
	s.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, s.URL+path, rd)
	req.Header.Set("X-API-Key", s.APIKey)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	c := &http.Client{Timeout: 2 * time.Minute}
	resp, err := c.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

type created struct {
	SandboxID       string `json:"sandboxID"`
	EnvdAccessToken string `json:"envdAccessToken"`
}

func (s *server) create(env map[string]string) created {
	s.t.Helper()
	st, b := s.do("POST", "/v2/sandboxes", map[string]any{"templateID": "base", "timeout": 600, "envVars": env}, nil)
	if st != http.StatusCreated {
		s.t.Fatalf("create: %d %s", st, b)
	}
	var c created
	_ = json.Unmarshal(b, &c)
	return c
}

func (s *server) state(id string) string {
	st, b := s.do("GET", "/sandboxes/"+id, nil, nil)
	if st != http.StatusOK {
		return fmt.Sprint(st)
	}
	var info struct {
		State string `json:"state"`
	}
	_ = json.Unmarshal(b, &info)
	return info.State
}

// envs reads envd's in-memory /init environment through the data plane.
func (s *server) envs(c created) (map[string]string, int) {
	st, b := s.do("GET", "/envs", nil, map[string]string{"E2b-Sandbox-Id": c.SandboxID, "E2b-Sandbox-Port": "49983", "X-Access-Token": c.EnvdAccessToken})
	var m map[string]string
	_ = json.Unmarshal(b, &m)
	return m, st
}

// TestSDK runs the official e2b SDK against a server with a warm pool.
func TestSDK(t *testing.T) {
	s := newServer(t)
	s.Restart(t, "--pool", "base=1")
	time.Sleep(3 * time.Second) // let the pool fill
	// sdk.test.mjs imports e2e/js's e2b.
	js := filepath.Join(s.Root, "e2e", "js")
	harness.NPMInstall(t, js)
	harness.SDKMatrix(t, js, "e2b")
	cmd := exec.Command("node", "--test", "--test-reporter=spec", "sdk.test.mjs")
	cmd.Env = append(os.Environ(), "E2B_API_URL="+s.URL, "E2B_SANDBOX_URL="+s.URL, "E2B_API_KEY="+s.APIKey)
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("node --test: %v", err)
	}
}

// TestPausedSurvivesRestart pauses sandboxes of both tiers (with memory,
// and files only), kills the server with SIGKILL, and resumes them on the
// next server: a memory pause keeps envd's in-memory env, a filesystem-only
// one boots fresh with the env it was created with.
func TestPausedSurvivesRestart(t *testing.T) {
	s := newServer(t)
	cases := []struct {
		name      string
		isolation string
		pause     map[string]any
	}{
		{name: "container", isolation: "container"},
		{name: "gvisor", isolation: "gvisor"},
		{name: "container files only", isolation: "container", pause: map[string]any{"memory": false}},
		{name: "gvisor files only", isolation: "gvisor", pause: map[string]any{"memory": false}},
	}
	ids := make([]created, len(cases))
	for i, tc := range cases {
		st, b := s.do("POST", "/v2/sandboxes", map[string]any{"templateID": "base", "timeout": 600,
			"envVars": map[string]string{"MARK": "before-restart"}, "metadata": map[string]string{"agentbox.isolation": tc.isolation}}, nil)
		if st != http.StatusCreated {
			t.Fatalf("%s: create: %d %s", tc.name, st, b)
		}
		_ = json.Unmarshal(b, &ids[i])
		if st, b := s.do("POST", "/sandboxes/"+ids[i].SandboxID+"/pause", tc.pause, nil); st != http.StatusNoContent {
			t.Fatalf("%s: pause: %d %s", tc.name, st, b)
		}
	}
	s.stop(syscall.SIGKILL)
	s.start()
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := ids[i]
			if got := s.state(c.SandboxID); got != "paused" {
				t.Fatalf("state after restart = %q, want paused", got)
			}
			if st, b := s.do("POST", "/v2/sandboxes/"+c.SandboxID+"/connect", map[string]any{"timeout": 60}, nil); st != http.StatusCreated {
				t.Fatalf("connect: %d %s", st, b)
			}
			if env, st := s.envs(c); env["MARK"] != "before-restart" {
				t.Fatalf("envd env after resume = %v (%d)", env, st)
			}
		})
	}
}

// TestFaultInjection crashes the server at every step of every transition
// and checks that the next server finds the old state or the new one, never
// a half, and that the sandbox is usable afterwards.
func TestFaultInjection(t *testing.T) {
	s := newServer(t)
	s.stop(syscall.SIGTERM) // each step launches its own
	for _, tc := range []struct {
		step    string
		prepare func(c created) // brings the sandbox to the transition's start
		trigger func(c created)
		allowed []string // states acceptable after the crash
	}{
		{step: "pause:persisted", trigger: func(c created) { s.do("POST", "/sandboxes/"+c.SandboxID+"/pause", nil, nil) }, allowed: []string{"running", "paused"}},
		{step: "pause:checkpointed", trigger: func(c created) { s.do("POST", "/sandboxes/"+c.SandboxID+"/pause", nil, nil) }, allowed: []string{"running", "paused"}},
		{step: "resume:persisted", prepare: func(c created) { s.do("POST", "/sandboxes/"+c.SandboxID+"/pause", nil, nil) },
			trigger: func(c created) {
				s.do("POST", "/v2/sandboxes/"+c.SandboxID+"/connect", map[string]any{"timeout": 60}, nil)
			}, allowed: []string{"paused", "running"}},
		{step: "resume:restored", prepare: func(c created) { s.do("POST", "/sandboxes/"+c.SandboxID+"/pause", nil, nil) },
			trigger: func(c created) {
				s.do("POST", "/v2/sandboxes/"+c.SandboxID+"/connect", map[string]any{"timeout": 60}, nil)
			}, allowed: []string{"paused", "running"}},
		{step: "snapshot:persisted", trigger: func(c created) { s.do("POST", "/sandboxes/"+c.SandboxID+"/snapshots", map[string]any{}, nil) }, allowed: []string{"running"}},
		{step: "snapshot:captured", trigger: func(c created) { s.do("POST", "/sandboxes/"+c.SandboxID+"/snapshots", map[string]any{}, nil) }, allowed: []string{"running"}},
	} {
		t.Run(tc.step, func(t *testing.T) {
			s.t = t
			s.start("--fault-step", tc.step)
			c := s.create(map[string]string{"MARK": tc.step})
			if tc.prepare != nil {
				tc.prepare(c)
			}
			go tc.trigger(c)
			if !s.waitExit(2 * time.Minute) {
				t.Fatalf("server did not exit at %s", tc.step)
			}
			s.start()
			got := s.state(c.SandboxID)
			ok := false
			for _, a := range tc.allowed {
				ok = ok || got == a
			}
			if !ok {
				t.Fatalf("after a crash at %s the sandbox is %q, want one of %v", tc.step, got, tc.allowed)
			}
			if got == "paused" {
				if st, b := s.do("POST", "/v2/sandboxes/"+c.SandboxID+"/connect", map[string]any{"timeout": 60}, nil); st != http.StatusCreated {
					t.Fatalf("connect after crash: %d %s", st, b)
				}
			}
			if env, st := s.envs(c); env["MARK"] != tc.step {
				t.Fatalf("envd after the crash at %s: env %v (%d); memory lost", tc.step, env, st)
			}
			if st, b := s.do("DELETE", "/sandboxes/"+c.SandboxID, nil, nil); st != http.StatusNoContent {
				t.Fatalf("kill: %d %s", st, b)
			}
			s.stop(syscall.SIGTERM)
		})
	}
}
