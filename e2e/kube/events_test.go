package kube

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/agentbox/agentbox/e2e/harness"
	"github.com/agentbox/agentbox/internal/kubeevents"
)

// getEvents is one events request: status, headers and body.
func getEvents(ctx context.Context, t *testing.T, base, key, path string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, "GET", base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

// hookEvent is what a webhook receiver and the events API read of an event.
type hookEvent struct {
	ID        string    `json:"id"`
	Type      string    `json:"type"`
	SandboxID string    `json:"sandboxId"`
	TeamID    string    `json:"sandboxTeamId"`
	Timestamp time.Time `json:"timestamp"`
}

// hookReceiver is a team's webhook endpoint on the host: it keeps every
// delivery whose e2b-signature verifies as E2B's documentation says
// (SHA-256 of secret+payload, base64 with '+'→'-', '/'→'_', '=' removed)
// and counts the others.
type hookReceiver struct {
	addr, secret string
	mu           sync.Mutex
	bad          int
	refusing     bool // answer 503 to every delivery
	got          []hookEvent
}

// refuse makes the receiver answer 503 (or 2xx again).
func (rc *hookReceiver) refuse(on bool) { rc.mu.Lock(); rc.refusing = on; rc.mu.Unlock() }

func startHookReceiver(t *testing.T, secret string) *hookReceiver {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rc := &hookReceiver{addr: ln.Addr().String(), secret: secret}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		h := sha256.Sum256([]byte(rc.secret + string(body)))
		want := strings.TrimRight(strings.NewReplacer("+", "-", "/", "_").Replace(base64.StdEncoding.EncodeToString(h[:])), "=")
		rc.mu.Lock()
		defer rc.mu.Unlock()
		if rc.refusing {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		if r.Header.Get("e2b-signature") != want {
			rc.bad++
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		var e hookEvent
		_ = json.Unmarshal(body, &e)
		rc.got = append(rc.got, e)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return rc
}

// missing lists the types of which no event of sandbox id arrived.
func (rc *hookReceiver) missing(id string, types ...string) []string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var out []string
	for _, ty := range types {
		if !slices.ContainsFunc(rc.got, func(e hookEvent) bool { return e.SandboxID == id && e.Type == ty }) {
			out = append(out, ty)
		}
	}
	return out
}

// TestKubeEvents drives a sandbox through the cluster API (serve
// --kubernetes) and checks its lifecycle events: served by the cluster API
// from the node agent that ran it, scoped to the team, paged like the local
// tier, and delivered, signed, to a webhook registered through the cluster
// API (kept as a Secret in the webhooks namespace, mirrored by the agent,
// delivered through its destination policy), with the deliveries it is
// owed counted on the cluster API. The agent and the replica run with the
// RBAC of deploy/k8s's ServiceAccounts. The agent's events feed answers
// only the token the replicas hold; an agent whose Lease ran out leaves
// the answer marked incomplete, not failed.
func TestKubeEvents(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	c, kcPath, secret := teamCluster(ctx, t)
	applyShippedRBAC(ctx, t, c)
	agentKC := serviceAccountKubeconfig(ctx, t, c, kcPath, "agentbox-system", "agentbox")
	apiKC := serviceAccountKubeconfig(ctx, t, c, kcPath, "agentbox-system", "agentbox-api")
	const hookSecret = "kube-webhook-secret-5e1d"
	rc := startHookReceiver(t, hookSecret)
	agent := harness.Start(t, harness.Args("--kube-controller", "--kubeconfig", agentKC,
		"--kube-node", "node-a", "--kube-lease-namespace", "agentbox-system", "--token-secret-file", secret,
		"--fetch-allow", rc.addr, "--webhook-retry-base", "500ms", "--webhook-retry-max", "2s", "--webhook-attempts", "200"))
	t.Cleanup(func() { drainTeamNamespaces(t, c, "team-a", "team-b") })
	rep := startReplica(t, agent.Bin, apiKC, secret, "--fetch-allow", rc.addr)
	keyA, keyB := mintKubeKey(t, agent.Bin, kcPath, "team-a"), mintKubeKey(t, agent.Bin, kcPath, "team-b")
	do := func(key, method, path, body string, want ...int) []byte {
		t.Helper()
		st, b := parityDo(ctx, t, rep.URL, key, method, path, body)
		if len(want) > 0 && !slices.Contains(want, st) {
			t.Fatalf("%s %s: %d %s, want %v", method, path, st, b, want)
		}
		return b
	}

	// A webhook of team A, kept in the cluster; the agent mirrors it.
	types := []string{"sandbox.lifecycle.created", "sandbox.lifecycle.paused", "sandbox.lifecycle.resumed", "sandbox.lifecycle.killed"}
	reg, _ := json.Marshal(map[string]any{"name": "kube-e2e", "url": "http://" + rc.addr + "/hook", "events": types, "signatureSecret": hookSecret})
	var hook struct {
		ID     string `json:"id"`
		TeamID string `json:"teamID"`
	}
	if err := json.Unmarshal(do(keyA, "POST", "/events/webhooks", string(reg), http.StatusCreated), &hook); err != nil || hook.ID == "" {
		t.Fatalf("webhook create: %v %+v", err, hook)
	}
	if hook.TeamID != "team-a" {
		t.Errorf("webhook teamID %q, want team-a", hook.TeamID)
	}
	mirrored := func() bool {
		b, _ := os.ReadFile(filepath.Join(agent.DataDir, "kube-webhooks.json"))
		return strings.Contains(string(b), hook.ID)
	}
	waitFor(ctx, t, "the agent to mirror the webhook", func() (bool, string) { return mirrored(), "not in the agent's kube-webhooks.json" })
	if b := do(keyB, "GET", "/events/webhooks", "", http.StatusOK); strings.Contains(string(b), hook.ID) {
		t.Errorf("team B lists team A's webhook: %s", b)
	}

	// The receiver is down at first: what it is owed piles up on the agent.
	rc.refuse(true)

	// A sandbox's life through the cluster API.
	var sbx struct {
		SandboxID string `json:"sandboxID"`
	}
	if err := json.Unmarshal(do(keyA, "POST", "/v2/sandboxes", `{"templateID":"base","timeout":300}`, http.StatusCreated), &sbx); err != nil || sbx.SandboxID == "" {
		t.Fatalf("create: %v", err)
	}
	id := sbx.SandboxID
	do(keyA, "POST", "/sandboxes/"+id+"/pause", "", http.StatusNoContent)
	waitFor(ctx, t, "the resume", func() (bool, string) {
		st, b := parityDo(ctx, t, rep.URL, keyA, "POST", "/sandboxes/"+id+"/resume", `{"timeout":300}`)
		return st == http.StatusCreated, fmt.Sprintf("%d %s", st, b)
	})
	do(keyA, "DELETE", "/sandboxes/"+id, "", http.StatusNoContent)

	// The events, oldest first, from the cluster API.
	var evs []hookEvent
	waitFor(ctx, t, "the sandbox's events through the cluster API", func() (bool, string) {
		evs = nil
		_ = json.Unmarshal(do(keyA, "GET", "/events/sandboxes/"+id+"?orderAsc=true&limit=100", "", http.StatusOK), &evs)
		var got []string
		for _, e := range evs {
			if len(got) == 0 || got[len(got)-1] != e.Type {
				got = append(got, e.Type)
			}
		}
		// In order: created first, killed last, paused before resumed.
		ok := len(got) >= 4 && got[0] == types[0] && got[len(got)-1] == types[3]
		if p, r := slices.Index(got, types[1]), slices.Index(got, types[2]); p < 0 || r < p {
			ok = false
		}
		return ok, strings.Join(got, ", ")
	})
	for _, e := range evs {
		if e.SandboxID != id || e.TeamID != "team-a" {
			t.Errorf("event %+v: want sandbox %s of team-a", e, id)
		}
	}
	// Paging: the same order, one page at a time.
	var page []hookEvent
	_ = json.Unmarshal(do(keyA, "GET", "/events/sandboxes/"+id+"?orderAsc=true&offset=1&limit=2", "", http.StatusOK), &page)
	if len(page) != 2 || page[0].ID != evs[1].ID || page[1].ID != evs[2].ID {
		t.Errorf("page offset=1 limit=2: %+v, want events 1 and 2 of %+v", page, evs)
	}
	var newest []hookEvent
	_ = json.Unmarshal(do(keyA, "GET", "/events/sandboxes/"+id+"?types=sandbox.lifecycle.killed&limit=1", "", http.StatusOK), &newest)
	if len(newest) != 1 || newest[0].Type != types[3] {
		t.Errorf("newest killed event: %+v", newest)
	}

	// Team B sees none of it.
	if b := do(keyB, "GET", "/events/sandboxes/"+id, "", http.StatusOK); string(b) != "[]" {
		t.Errorf("team B reads team A's sandbox's events: %s", b)
	}
	if b := do(keyB, "GET", "/events/sandboxes?limit=100", "", http.StatusOK); strings.Contains(string(b), id) {
		t.Errorf("team B's event feed holds team A's sandbox: %s", b)
	}

	// What the receiver is owed, as the agent counts it, on the cluster API.
	var view struct {
		Pending int `json:"pendingDeliveries"`
	}
	waitFor(ctx, t, "pendingDeliveries on the cluster API", func() (bool, string) {
		b := do(keyA, "GET", "/events/webhooks/"+hook.ID, "", http.StatusOK)
		_ = json.Unmarshal(b, &view)
		return view.Pending >= len(types), string(b)
	})
	var list []struct {
		ID      string `json:"id"`
		Pending int    `json:"pendingDeliveries"`
	}
	if err := json.Unmarshal(do(keyA, "GET", "/events/webhooks", "", http.StatusOK), &list); err != nil || len(list) != 1 || list[0].Pending < len(types) {
		t.Errorf("webhook list: %+v %v, want the webhook with %d or more deliveries owed", list, err, len(types))
	}
	rc.refuse(false)

	// Delivered, signed, to the receiver.
	waitFor(ctx, t, "the webhook deliveries", func() (bool, string) {
		m := rc.missing(id, types...)
		return len(m) == 0, "missing " + strings.Join(m, ", ")
	})
	rc.mu.Lock()
	if rc.bad > 0 {
		t.Errorf("%d deliveries did not verify", rc.bad)
	}
	rc.mu.Unlock()
	waitFor(ctx, t, "nothing owed on the cluster API", func() (bool, string) {
		b := do(keyA, "GET", "/events/webhooks/"+hook.ID, "", http.StatusOK)
		_ = json.Unmarshal(b, &view)
		return view.Pending == 0, string(b)
	})

	// A node agent whose Lease ran out an hour ago (gone, or cut off from
	// the cluster): the events of the others, marked incomplete.
	st, _ := json.Marshal(map[string]string{"node": "node-gone", "address": "127.0.0.1:1"})
	renewed := metav1.NewMicroTime(time.Now().Add(-time.Hour))
	gone := &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "agentbox-system", Name: "agentbox-node-node-gone",
		Labels: map[string]string{"agentbox.dev/node-agent": "true"}, Annotations: map[string]string{"agentbox.dev/node-status": string(st)}},
		Spec: coordv1.LeaseSpec{RenewTime: &renewed, LeaseDurationSeconds: new(int32(15))}}
	if err := c.Create(ctx, gone); err != nil {
		t.Fatal(err)
	}
	status, hdr, body := getEvents(ctx, t, rep.URL, keyA, "/events/sandboxes/"+id+"?orderAsc=true&limit=100")
	if status != http.StatusOK || !strings.Contains(string(body), evs[0].ID) {
		t.Errorf("events with a node agent gone: %d %s, want 200 and node-a's events", status, body)
	}
	if h := hdr.Get("Agentbox-Events-Incomplete"); !strings.HasPrefix(h, "1 of 2 node agents not read (1 Lease expired)") {
		t.Errorf("Agentbox-Events-Incomplete %q, want it to say one agent's Lease expired", h)
	}
	if err := c.Delete(ctx, gone); err != nil {
		t.Fatal(err)
	}
	if _, hdr, _ := getEvents(ctx, t, rep.URL, keyA, "/events/sandboxes/"+id); hdr.Get("Agentbox-Events-Incomplete") != "" {
		t.Errorf("Agentbox-Events-Incomplete %q with every agent read", hdr.Get("Agentbox-Events-Incomplete"))
	}

	// The agent's feed: only with the replicas' token.
	feed := agent.URL + kubeevents.FeedPath + "?team=team-a&limit=10"
	sec, err := os.ReadFile(secret)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, auth string
		want       int
	}{
		{"no token", "", http.StatusUnauthorized},
		{"an API key of the team", "Bearer " + keyA, http.StatusUnauthorized},
		{"a token of another secret", "Bearer " + kubeevents.FeedToken([]byte("another secret of 32 bytes or more!!")), http.StatusUnauthorized},
		{"the replicas' token", "Bearer " + kubeevents.FeedToken(sec), http.StatusOK},
	} {
		req, _ := http.NewRequestWithContext(ctx, "GET", feed, nil)
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		req.Header.Set("X-API-Key", keyA)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("feed with %s: %d %s, want %d", tc.name, resp.StatusCode, b, tc.want)
		}
		if tc.want == http.StatusOK && !strings.Contains(string(b), id) {
			t.Errorf("feed with %s: %s, want the sandbox's events", tc.name, b)
		}
	}

	// A webhook deleted through the cluster API leaves the agent.
	do(keyB, "DELETE", "/events/webhooks/"+hook.ID, "", http.StatusNotFound)
	do(keyA, "DELETE", "/events/webhooks/"+hook.ID, "", http.StatusOK)
	waitFor(ctx, t, "the agent to drop the webhook", func() (bool, string) { return !mirrored(), "still in the agent's kube-webhooks.json" })
}
