package events

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/destpolicy"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/store"
)

// verifyAsE2BDocs is the verification E2B's webhook documentation gives
// its users (sandbox/lifecycle-events-webhooks): SHA-256 of secret+payload,
// standard base64, '+' to '-', '/' to '_', trailing '=' removed.
func verifyAsE2BDocs(secret, payload, signature string) bool {
	h := sha256.Sum256([]byte(secret + payload))
	exp := base64.StdEncoding.EncodeToString(h[:])
	exp = strings.ReplaceAll(exp, "+", "-")
	exp = strings.ReplaceAll(exp, "/", "_")
	exp = strings.TrimRight(exp, "=")
	return exp == signature
}

func TestSignVerifiesAsE2BDocuments(t *testing.T) {
	sawURLSafe := false
	for i := range 200 {
		secret := "secret-" + strings.Repeat("x", i%7)
		body := `{"id":"` + strings.Repeat("é", i) + `"}`
		sig := Sign(secret, []byte(body))
		if !verifyAsE2BDocs(secret, body, sig) {
			t.Fatalf("E2B's documented check refuses Sign(%q, %q) = %q", secret, body, sig)
		}
		if verifyAsE2BDocs(secret+"!", body, sig) || verifyAsE2BDocs(secret, body+" ", sig) {
			t.Fatal("signature verifies under another secret or body")
		}
		sawURLSafe = sawURLSafe || strings.ContainsAny(sig, "-_")
	}
	if !sawURLSafe {
		t.Fatal("no signature used the URL-safe characters: the vector does not tell the alphabets apart")
	}
}

func TestParseEventQuery(t *testing.T) {
	tests := []struct {
		q       string
		want    EventQuery
		wantErr string
	}{
		{"", EventQuery{Limit: 10}, ""},
		{"offset=5&limit=100&orderAsc=true", EventQuery{Offset: 5, Limit: 100, Asc: true}, ""},
		{"types=sandbox.lifecycle.created&types=sandbox.lifecycle.killed", EventQuery{Limit: 10, Types: []string{TypeCreated, TypeKilled}}, ""},
		{"types=sandbox.lifecycle.paused,sandbox.policy.violation", EventQuery{Limit: 10, Types: []string{TypePaused, TypePolicyViolation}}, ""},
		{"limit=0", EventQuery{}, "limit"},
		{"limit=101", EventQuery{}, "limit"},
		{"offset=-1", EventQuery{}, "offset"},
		{"orderAsc=maybe", EventQuery{}, "orderAsc"},
		{"types=sandbox.lifecycle.exploded", EventQuery{}, "not an event type"},
	}
	for _, tt := range tests {
		v, _ := url.ParseQuery(tt.q)
		got, err := ParseEventQuery(v)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("%q: err %v, want one naming %q", tt.q, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tt.q, err)
			continue
		}
		gb, _ := json.Marshal(got)
		wb, _ := json.Marshal(tt.want)
		if string(gb) != string(wb) {
			t.Errorf("%q: got %s, want %s", tt.q, gb, wb)
		}
	}
}

func TestLifecycleType(t *testing.T) {
	row := func(action, decision, team string) store.AuditRow {
		return store.AuditRow{SandboxID: "s", TeamID: team, Kind: audit.KindLifecycle, Action: action, Decision: decision}
	}
	tests := []struct {
		r      store.AuditRow
		fields map[string]any
		want   string
	}{
		{row("create", "allowed", "t"), map[string]any{"path": "create"}, TypeCreated},
		{row("create", "allowed", "t"), map[string]any{"path": "fork"}, TypeCreated},
		{row("create", "denied", "t"), map[string]any{"path": "create"}, ""},
		{row("create", "allowed", "t"), map[string]any{"path": "build"}, ""},
		{row("create", "allowed", "t"), map[string]any{"build": "b1"}, ""},
		{row("create", "allowed", hiddenTeam), nil, ""},
		{row("resume", "allowed", "t"), nil, TypeResumed},
		{row("pause", "allowed", "t"), nil, TypePaused},
		{row("update", "allowed", "t"), nil, TypeUpdated},
		{row("snapshot", "allowed", "t"), nil, TypeCheckpointed},
		{row("remove", "info", "t"), nil, TypeKilled},
		{row("unhealthy", "info", "t"), nil, ""},
		{row("volume-create", "allowed", "t"), nil, ""},
	}
	for _, tt := range tests {
		if got := lifecycleType(tt.r, tt.fields); got != tt.want {
			t.Errorf("%s/%s/%s %v: %q, want %q", tt.r.Action, tt.r.Decision, tt.r.TeamID, tt.fields, got, tt.want)
		}
	}
}

func TestViolationsAggregate(t *testing.T) {
	v := newViolations(time.Minute, 100)
	t0 := time.Unix(1000, 0)
	k := violationKey{"t", "s", "egress"}
	if x := v.observe(t0, k, 1, t0, "denied a"); x == nil || x.count != 1 {
		t.Fatalf("first refusal is not reported at once: %+v", x)
	}
	for i := range 50 {
		if x := v.observe(t0.Add(time.Duration(i)*time.Second), k, 2, t0, "denied b"); x != nil {
			t.Fatalf("refusal %d inside the window reported on its own", i)
		}
	}
	if got := v.due(t0.Add(30 * time.Second)); len(got) != 0 {
		t.Fatalf("window reported before it ended: %+v", got)
	}
	got := v.due(t0.Add(time.Minute))
	if len(got) != 1 || got[0].count != 100 || len(got[0].samples) != 1 {
		t.Fatalf("end of window: %+v, want one violation of 100 with one reason", got)
	}
	if got := v.due(t0.Add(2 * time.Minute)); len(got) != 0 {
		t.Fatalf("quiet window reported: %+v", got)
	}
	if len(v.open) != 0 {
		t.Fatalf("quiet window kept open")
	}
	if x := v.observe(t0, violationKey{"t", "s", "oom"}, 1, t0, ""); x == nil {
		t.Fatal("another rule is not reported at once")
	}
}

// ---- the service against a real store, audit log and receiver ----

type receiver struct {
	mu     sync.Mutex
	status int
	got    []delivery
	srv    *httptest.Server
	secret string
}

type delivery struct {
	header http.Header
	body   string
	ev     Event
	valid  bool
}

func newReceiver(t *testing.T, secret string) *receiver {
	rc := &receiver{status: http.StatusOK, secret: secret}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		defer rc.mu.Unlock()
		if rc.status != http.StatusOK {
			w.WriteHeader(rc.status)
			return
		}
		d := delivery{header: r.Header.Clone(), body: string(b), valid: verifyAsE2BDocs(rc.secret, string(b), r.Header.Get("e2b-signature"))}
		_ = json.Unmarshal(b, &d.ev)
		rc.got = append(rc.got, d)
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *receiver) setStatus(s int) { rc.mu.Lock(); rc.status = s; rc.mu.Unlock() }

func (rc *receiver) deliveries() []delivery {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]delivery(nil), rc.got...)
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

type fixture struct {
	st  *store.Store
	log *audit.Log
	pol *destpolicy.Policy
}

func newFixture(t *testing.T, allow ...string) *fixture {
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "a.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	var cfg destpolicy.Config
	for _, a := range allow {
		x, err := destpolicy.ParseAllowed(a)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Allow = append(cfg.Allow, x)
	}
	return &fixture{st: st, log: audit.New(st), pol: destpolicy.New(cfg)}
}

func (f *fixture) service(t *testing.T, cfg Config) (*Service, context.CancelFunc) {
	cfg.RetryBase, cfg.RetryMax = 10*time.Millisecond, 50*time.Millisecond
	svc, err := New(context.Background(), cfg, f.st, f.log, nil, f.pol, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { svc.Run(ctx); close(done) }()
	stop := func() { cancel(); <-done }
	t.Cleanup(stop)
	return svc, stop
}

func (f *fixture) lifecycle(t *testing.T, team, sandboxID, action string, fields map[string]any) {
	decision := audit.Allowed
	if action == "remove" {
		decision = audit.Info
	}
	if err := f.log.Append(context.Background(), audit.Event{SandboxID: sandboxID, TeamID: team, Kind: audit.KindLifecycle,
		Action: action, Decision: decision, Reason: map[bool]string{true: "killed"}[action == "remove"], Fields: fields}); err != nil {
		t.Fatal(err)
	}
}

// call serves one request of team through the service's routes.
func call(t *testing.T, svc *Service, team, method, target string, body any) (int, []byte) {
	mux := http.NewServeMux()
	for p, h := range svc.Routes(func(*http.Request) string { return team }) {
		mux.HandleFunc(p, h)
	}
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = strings.NewReader(string(b))
	}
	w := httptest.NewRecorder()
	mux.ServeHTTP(w, httptest.NewRequest(method, target, rd))
	return w.Code, w.Body.Bytes()
}

func TestEventsAndWebhooks(t *testing.T) {
	const secret = "a-secret-of-the-team"
	rc := newReceiver(t, secret)
	host := strings.TrimPrefix(rc.srv.URL, "http://")
	f := newFixture(t, host)
	svc, stop := f.service(t, Config{})

	st, b := call(t, svc, "team-a", "POST", "/events/webhooks", map[string]any{"name": "hook", "url": rc.srv.URL + "/hook", "enabled": true,
		"events": []string{TypeCreated, TypePaused, TypeResumed, TypeKilled, TypeUpdated, TypeCheckpointed}, "signatureSecret": secret})
	if st != http.StatusCreated {
		t.Fatalf("register webhook: %d %s", st, b)
	}
	if strings.Contains(string(b), secret) {
		t.Fatalf("the secret came back: %s", b)
	}
	var hook Webhook
	_ = json.Unmarshal(b, &hook)

	for _, a := range []string{"create", "update", "pause", "resume", "snapshot", "remove"} {
		f.lifecycle(t, "team-a", "sbx-1", a, map[string]any{"path": a, "template": "base", "end_at": "2030-01-01T00:00:00Z"})
	}
	f.lifecycle(t, "team-b", "sbx-2", "create", map[string]any{"path": "create"})
	want := []string{TypeCreated, TypeUpdated, TypePaused, TypeResumed, TypeCheckpointed, TypeKilled}
	waitFor(t, "six deliveries", func() bool { return len(rc.deliveries()) >= len(want) })
	// Deliveries run side by side: their order is the events' timestamps.
	ds := rc.deliveries()
	sort.Slice(ds, func(i, j int) bool { return ds[i].ev.Timestamp.Before(ds[j].ev.Timestamp) })
	for i, d := range ds {
		if !d.valid {
			t.Errorf("delivery %d: signature does not verify as E2B documents: %s", i, d.header.Get("e2b-signature"))
		}
		if d.header.Get("e2b-webhook-id") != hook.ID || d.header.Get("e2b-signature-version") != "v1" || d.header.Get("e2b-delivery-id") == "" {
			t.Errorf("delivery %d headers: %v", i, d.header)
		}
		if d.ev.Type != want[i] || d.ev.SandboxID != "sbx-1" || d.ev.SandboxTeamID != "team-a" || d.ev.SandboxTemplateID != "base" {
			t.Errorf("delivery %d: %s", i, d.body)
		}
	}

	// The events API: newest first, filters, paging, the team's own only.
	list := func(team, q string) []Event {
		st, b := call(t, svc, team, "GET", q, nil)
		if st != http.StatusOK {
			t.Fatalf("GET %s: %d %s", q, st, b)
		}
		var out []Event
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatalf("GET %s: %v: %s", q, err, b)
		}
		return out
	}
	got := list("team-a", "/events/sandboxes/sbx-1?limit=100")
	if len(got) != 6 || got[0].Type != TypeKilled || got[5].Type != TypeCreated {
		t.Fatalf("newest first: %+v", got)
	}
	if got[0].EventData["kill_reason"] != "request" {
		t.Errorf("killed eventData: %v", got[0].EventData)
	}
	if e := list("team-a", "/events/sandboxes/sbx-1?types="+TypeUpdated)[0]; e.EventData["set_timeout"] != "2030-01-01T00:00:00Z" {
		t.Errorf("updated eventData: %v", e.EventData)
	}
	if got := list("team-a", "/events/sandboxes/sbx-1?orderAsc=true&offset=1&limit=2"); len(got) != 2 || got[0].Type != TypeUpdated || got[1].Type != TypePaused {
		t.Errorf("paging: %+v", got)
	}
	if got := list("team-a", "/events/sandboxes?types=sandbox.lifecycle.created&types=sandbox.lifecycle.killed"); len(got) != 2 {
		t.Errorf("types filter over the team: %+v", got)
	}
	if got := list("team-b", "/events/sandboxes/sbx-1"); len(got) != 0 {
		t.Errorf("another team sees team-a's sandbox events: %+v", got)
	}
	if got := list("team-b", "/events/sandboxes"); len(got) != 1 || got[0].SandboxID != "sbx-2" {
		t.Errorf("team-b's own events: %+v", got)
	}
	for _, m := range []string{"GET", "PATCH", "DELETE"} {
		if st, b := call(t, svc, "team-b", m, "/events/webhooks/"+hook.ID, map[string]any{"enabled": false}); st != http.StatusNotFound {
			t.Errorf("team-b %s team-a's webhook: %d %s", m, st, b)
		}
	}
	if _, b := call(t, svc, "team-b", "GET", "/events/webhooks", nil); strings.Contains(string(b), hook.ID) {
		t.Errorf("team-b lists team-a's webhook: %s", b)
	}

	// Deliveries owed while the receiver is down survive a restart.
	rc.setStatus(http.StatusServiceUnavailable)
	f.lifecycle(t, "team-a", "sbx-3", "create", map[string]any{"path": "create"})
	waitFor(t, "a failed attempt", func() bool {
		n, _ := f.st.PendingDeliveries(context.Background(), hook.ID)
		ds, _ := f.st.DueDeliveries(context.Background(), time.Now().Add(time.Hour), 10)
		return n == 1 && len(ds) == 1 && ds[0].Attempts > 0
	})
	stop()
	rc.setStatus(http.StatusOK)
	before := len(rc.deliveries())
	f.service(t, Config{})
	waitFor(t, "the owed delivery after the restart", func() bool { return len(rc.deliveries()) > before })
	if d := rc.deliveries()[before]; d.ev.SandboxID != "sbx-3" || !d.valid {
		t.Fatalf("after restart: %s", d.body)
	}
}

func TestWebhookRefusals(t *testing.T) {
	rc := newReceiver(t, "x")
	f := newFixture(t, strings.TrimPrefix(rc.srv.URL, "http://"))
	svc, _ := f.service(t, Config{MaxWebhooks: 1})
	base := map[string]any{"name": "n", "enabled": true, "events": []string{TypeCreated}, "signatureSecret": "long-enough"}
	with := func(k string, v any) map[string]any {
		m := map[string]any{}
		for a, b := range base {
			m[a] = b
		}
		m["url"] = rc.srv.URL
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
		return m
	}
	tests := []struct {
		name string
		body map[string]any
		want string
	}{
		{"loopback", with("url", "http://127.0.0.1:1/x"), "loopback"},
		{"localhost name", with("url", "http://localhost:1/x"), "--fetch-allow"},
		{"metadata", with("url", "http://169.254.169.254/latest/meta-data"), "--fetch-allow"},
		{"private", with("url", "http://10.1.2.3/"), "--fetch-allow"},
		{"not http", with("url", "file:///etc/passwd"), "http"},
		{"no events", with("events", []string{}), "events"},
		{"bad event", with("events", []string{"sandbox.lifecycle.exploded"}), "not an event type"},
		{"short secret", with("signatureSecret", "x"), "signatureSecret"},
		{"no secret", with("signatureSecret", nil), "signatureSecret"},
		{"unknown field", with("urll", "x"), "unknown field"},
	}
	for _, tt := range tests {
		st, b := call(t, svc, "t", "POST", "/events/webhooks", tt.body)
		if st != http.StatusBadRequest || !strings.Contains(string(b), tt.want) {
			t.Errorf("%s: %d %s, want 400 naming %q", tt.name, st, b, tt.want)
		}
	}
	if st, b := call(t, svc, "t", "POST", "/events/webhooks", with("url", rc.srv.URL)); st != http.StatusCreated {
		t.Fatalf("allowed receiver: %d %s", st, b)
	}
	if st, b := call(t, svc, "t", "POST", "/events/webhooks", with("url", rc.srv.URL)); st != http.StatusTooManyRequests || !strings.Contains(string(b), "--max-webhooks") {
		t.Errorf("past the bound: %d %s", st, b)
	}
}

// A name that resolves to a closed address only at delivery time (or a
// row written before the policy changed) is refused at connect: never
// delivered, and the webhook says why.
func TestDeliveryRefusedAtConnect(t *testing.T) {
	rc := newReceiver(t, "long-enough")
	f := newFixture(t) // nothing opened: the receiver on loopback is closed
	svc, _ := f.service(t, Config{})
	if err := f.st.CreateWebhook(context.Background(), store.WebhookRow{ID: "w1", TeamID: "t", URL: rc.srv.URL, Enabled: true,
		Events: []string{TypeCreated}, Secret: "long-enough", CreatedAt: time.Now()}, 0, ""); err != nil {
		t.Fatal(err)
	}
	f.lifecycle(t, "t", "s", "create", map[string]any{"path": "create"})
	waitFor(t, "the refusal on the webhook", func() bool {
		w, _ := f.st.GetWebhook(context.Background(), "t", "w1")
		return strings.Contains(w.LastError, "--fetch-allow")
	})
	if n := len(rc.deliveries()); n != 0 {
		t.Fatalf("the receiver on loopback got %d deliveries", n)
	}
	_ = svc
}

func TestQueueBound(t *testing.T) {
	rc := newReceiver(t, "long-enough")
	rc.setStatus(http.StatusServiceUnavailable)
	f := newFixture(t, strings.TrimPrefix(rc.srv.URL, "http://"))
	svc, _ := f.service(t, Config{QueueMax: 2, Attempts: 1000})
	if st, b := call(t, svc, "t", "POST", "/events/webhooks", map[string]any{"url": rc.srv.URL, "events": []string{TypeCreated}, "signatureSecret": "long-enough"}); st != http.StatusCreated {
		t.Fatalf("%d %s", st, b)
	}
	for i := range 5 {
		f.lifecycle(t, "t", "s"+string(rune('a'+i)), "create", map[string]any{"path": "create"})
	}
	waitFor(t, "three drops", func() bool {
		_, b := call(t, svc, "t", "GET", "/events/webhooks", nil)
		var ws []Webhook
		_ = json.Unmarshal(b, &ws)
		return len(ws) == 1 && ws[0].DroppedDeliveries == 3 && ws[0].PendingDeliveries == 2 && strings.Contains(ws[0].LastError, "--webhook-queue-max")
	})
}

func TestPolicyViolationEvents(t *testing.T) {
	f := newFixture(t)
	svc, _ := f.service(t, Config{ViolationWindow: 50 * time.Millisecond})
	ctx := context.Background()
	for range 30 {
		if err := f.log.Append(ctx, audit.Event{SandboxID: "s", TeamID: "t", Kind: audit.KindSyscall, Action: "mount", Decision: audit.Denied, Reason: "syscall mount refused", Fields: map[string]any{"count": 2}}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the first and the aggregated violation", func() bool {
		_, b := call(t, svc, "t", "GET", "/events/sandboxes/s?limit=100&types="+TypePolicyViolation, nil)
		var evs []Event
		_ = json.Unmarshal(b, &evs)
		total := 0.0
		for _, e := range evs {
			if e.EventData["rule"] != "syscall" {
				return false
			}
			total += e.EventData["count"].(float64)
		}
		// The first is reported at once, the rest per window: fewer events
		// than refusals, every refusal counted.
		return len(evs) >= 2 && len(evs) < 30 && total == 60
	})
}

func TestViolationRule(t *testing.T) {
	row := func(kind, action, decision string) store.AuditRow {
		return store.AuditRow{SandboxID: "s", TeamID: "t", Kind: kind, Action: action, Decision: decision}
	}
	tests := []struct {
		r      store.AuditRow
		fields map[string]any
		rule   string
		count  int64
	}{
		{row(audit.KindFile, "write", audit.Denied), map[string]any{"status": 403.0, "path": "/etc/passwd"}, "path", 1},
		{row(audit.KindFile, "remove", audit.Denied), map[string]any{"status": 403.0}, "path", 1},
		{row(audit.KindFile, "write", audit.Denied), map[string]any{"status": 404.0}, "", 0},
		{row(audit.KindFile, "write", audit.Denied), map[string]any{"status": 507.0}, "", 0},
		{row(audit.KindFile, "write", audit.Allowed), map[string]any{"path": "/home/user/x"}, "", 0},
		{row(audit.KindSyscall, "mount", audit.Denied), map[string]any{"count": 3.0}, "syscall", 3},
		{row(audit.KindLimit, "oom", audit.Denied), map[string]any{"killed": 2.0}, "oom", 2},
		{row(audit.KindProcess, "start", audit.Denied), nil, "", 0},
	}
	for _, tt := range tests {
		rule, n := violationRule(tt.r, tt.fields)
		if rule != tt.rule || n != tt.count {
			t.Errorf("%s/%s/%s %v: %q %d, want %q %d", tt.r.Kind, tt.r.Action, tt.r.Decision, tt.fields, rule, n, tt.rule, tt.count)
		}
	}
}

func TestRetentionByAge(t *testing.T) {
	f := newFixture(t)
	svc, _ := f.service(t, Config{MaxAge: time.Hour})
	ctx := context.Background()
	old := svc.event(TypeCreated, "t", "s", time.Now().Add(-2*time.Hour), Info{}, map[string]any{})
	fresh := svc.event(TypeKilled, "t", "s", time.Now(), Info{}, map[string]any{})
	if _, _, err := f.st.AppendEvents(ctx, store.EventBatch{Events: []store.EventRow{old, fresh}}); err != nil {
		t.Fatal(err)
	}
	_, b := call(t, svc, "t", "GET", "/events/sandboxes/s", nil)
	if strings.Contains(string(b), old.ID) || !strings.Contains(string(b), fresh.ID) {
		t.Fatalf("served past --events-max-age: %s", b)
	}
	if _, err := f.st.PruneEvents(ctx, time.Now().Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	kept, err := f.st.ListEvents(ctx, store.EventFilter{TeamID: "t", Limit: 10})
	if err != nil || len(kept) != 1 || !strings.Contains(kept[0], fresh.ID) {
		t.Fatalf("after pruning: %v %v, want only the fresh event", kept, err)
	}
}
