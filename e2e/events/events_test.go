// Package events is the end-to-end test of lifecycle events and webhooks:
// a real HTTP receiver on the host, opened with --fetch-allow, verifies
// every delivery the way E2B's documentation tells its users to, and a
// server killed with SIGKILL while deliveries are owed sends them after it
// starts again.
package events

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
	"github.com/agentbox/agentbox/e2e/wire"
)

// verify is E2B's documented webhook check (sandbox/lifecycle-events-
// webhooks): SHA-256 of secret+payload, base64 with '+'→'-', '/'→'_' and
// the trailing '=' removed, compared with the e2b-signature header.
func verify(secret, payload, signature string) bool {
	h := sha256.Sum256([]byte(secret + payload))
	exp := base64.StdEncoding.EncodeToString(h[:])
	exp = strings.ReplaceAll(exp, "+", "-")
	exp = strings.ReplaceAll(exp, "/", "_")
	exp = strings.TrimRight(exp, "=")
	return exp == signature
}

type event struct {
	ID        string         `json:"id"`
	Type      string         `json:"type"`
	SandboxID string         `json:"sandboxId"`
	TeamID    string         `json:"sandboxTeamId"`
	Template  string         `json:"sandboxTemplateId"`
	Data      map[string]any `json:"eventData"`
	Timestamp time.Time      `json:"timestamp"`
}

// receiver is the team's webhook endpoint: it records every delivery whose
// signature verifies, and answers 503 while down.
type receiver struct {
	addr   string
	secret string

	mu       sync.Mutex
	down     bool
	refused  int // requests answered 503
	bad      int // deliveries whose signature did not verify
	received []event
}

func startReceiver(t *testing.T, secret string) *receiver {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rc := &receiver{addr: ln.Addr().String(), secret: secret}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		defer rc.mu.Unlock()
		if rc.down {
			rc.refused++
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		if !verify(rc.secret, string(body), r.Header.Get("e2b-signature")) {
			rc.bad++
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		var e event
		_ = json.Unmarshal(body, &e)
		rc.received = append(rc.received, e)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return rc
}

func (rc *receiver) setDown(d bool) { rc.mu.Lock(); rc.down = d; rc.mu.Unlock() }

// has reports whether sandbox id's events of each type arrived.
func (rc *receiver) has(id string, types ...string) bool {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, ty := range types {
		if !slices.ContainsFunc(rc.received, func(e event) bool { return e.SandboxID == id && e.Type == ty }) {
			return false
		}
	}
	return true
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestLifecycleWebhooks(t *testing.T) {
	const secret = "e2e-webhook-secret-0f3a"
	rc := startReceiver(t, secret)
	s := harness.Start(t, harness.Args("--fetch-allow", rc.addr,
		"--webhook-retry-base", "200ms", "--webhook-retry-max", "1s", "--webhook-attempts", "1000"))
	ctx := context.Background()
	do := func(method, path string, body any, want int) []byte {
		t.Helper()
		st, b, err := s.Do(ctx, s.APIKey, method, path, body)
		if err != nil || st != want {
			t.Fatalf("%s %s: %d %s %v, want %d", method, path, st, b, err, want)
		}
		return b
	}

	var hook struct{ ID string }
	all := []string{"sandbox.lifecycle.created", "sandbox.lifecycle.updated", "sandbox.lifecycle.paused", "sandbox.lifecycle.resumed",
		"sandbox.lifecycle.checkpointed", "sandbox.lifecycle.killed"}
	_ = json.Unmarshal(do("POST", "/events/webhooks", map[string]any{"name": "e2e", "url": "http://" + rc.addr + "/hook",
		"enabled": true, "events": all, "signatureSecret": secret}, http.StatusCreated), &hook)
	if hook.ID == "" {
		t.Fatal("no webhook id")
	}

	var templateID string // what the API calls the sandbox's template
	create := func() string {
		var sb struct{ SandboxID, TemplateID string }
		_ = json.Unmarshal(do("POST", "/v2/sandboxes", map[string]any{"templateID": "base", "timeout": 300, "metadata": map[string]string{"who": "e2e"}}, http.StatusCreated), &sb)
		templateID = sb.TemplateID
		return sb.SandboxID
	}
	id := create()
	do("POST", "/sandboxes/"+id+"/timeout", map[string]any{"timeout": 600}, http.StatusNoContent)
	do("POST", "/sandboxes/"+id+"/snapshots", map[string]any{}, http.StatusCreated)
	do("POST", "/sandboxes/"+id+"/pause", nil, http.StatusNoContent)
	do("POST", "/v2/sandboxes/"+id+"/connect", map[string]any{"timeout": 60}, http.StatusCreated)
	do("DELETE", "/sandboxes/"+id, nil, http.StatusNoContent)
	waitFor(t, "every lifecycle event at the receiver", func() bool { return rc.has(id, all...) })

	var listed []event
	_ = json.Unmarshal(do("GET", "/events/sandboxes/"+id+"?limit=100", nil, http.StatusOK), &listed)
	var types []string
	for _, e := range listed {
		types = append(types, e.Type)
		if e.SandboxID != id || e.Template != templateID {
			t.Errorf("event %+v", e)
		}
	}
	if len(listed) != 6 || listed[0].Type != "sandbox.lifecycle.killed" || listed[5].Type != "sandbox.lifecycle.created" {
		t.Errorf("GET /events/sandboxes/%s (newest first): %v", id, types)
	}
	if md, _ := listed[0].Data["sandbox_metadata"].(map[string]any); md["who"] != "e2e" {
		t.Errorf("killed event's eventData: %v", listed[0].Data)
	}

	// The CLI prints them.
	out, err := exec.Command(s.Bin, "events", id, "--api-url", s.URL, "--api-key", s.APIKey).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "created") || !strings.Contains(string(out), "killed") {
		t.Errorf("agentbox events %s: %v\n%s", id, err, out)
	}

	// Deliveries owed when the server is killed are sent after it starts
	// again.
	rc.setDown(true)
	id2 := create()
	do("DELETE", "/sandboxes/"+id2, nil, http.StatusNoContent)
	waitFor(t, "the receiver to refuse a delivery", func() bool { rc.mu.Lock(); defer rc.mu.Unlock(); return rc.refused > 0 })
	s.Kill9(t)
	rc.setDown(false)
	s.Launch(t)
	waitFor(t, "the owed deliveries after a SIGKILL and restart", func() bool {
		return rc.has(id2, "sandbox.lifecycle.created", "sandbox.lifecycle.killed")
	})
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.bad > 0 {
		t.Errorf("%d deliveries failed E2B's documented signature check", rc.bad)
	}
}

// TestDeniedPathViolation: a file call the sandbox refuses for its path
// (the default user writing under /etc) is a policy violation with rule
// "path", readable in the sandbox's event feed like denied egress.
func TestDeniedPathViolation(t *testing.T) {
	s := harness.Start(t)
	ctx := context.Background()
	c := wire.New(s.URL, s.APIKey)
	sb, err := c.Create(ctx, wire.CreateRequest{TemplateID: "base", Timeout: 300})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Kill(context.Background(), sb.SandboxID) })
	for range 3 {
		err := c.Upload(ctx, sb, "/etc/agentbox-denied.txt", strings.NewReader("x"), 1)
		if we, ok := err.(*wire.Error); !ok || we.Status != http.StatusForbidden {
			t.Fatalf("upload to /etc as the default user: %v, want 403", err)
		}
	}
	waitFor(t, "a sandbox.policy.violation event with rule path", func() bool {
		st, b, err := s.Do(ctx, s.APIKey, "GET", "/events/sandboxes/"+sb.SandboxID+"?limit=100&types=sandbox.policy.violation", nil)
		if err != nil || st != http.StatusOK {
			return false
		}
		var evs []event
		_ = json.Unmarshal(b, &evs)
		for _, e := range evs {
			if e.Data["rule"] == "path" {
				return true
			}
		}
		return false
	})
}
