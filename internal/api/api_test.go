package api

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api/gen/rest"
	"github.com/agentbox/agentbox/internal/apireq"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/httperr"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store"
)

func decodeString(t *testing.T, body string, limit int64) (rest.NewSandbox, error) {
	t.Helper()
	var b rest.NewSandbox
	r := httptest.NewRequest(http.MethodPost, "/v2/sandboxes", strings.NewReader(body))
	err := apireq.DecodeJSON(httptest.NewRecorder(), r, limit, false, &b)
	return b, err
}

func TestCreateValidation(t *testing.T) {
	s := &Server{MaxBody: 1 << 20, be: LocalBackend{}} // network checks need no manager
	long := strings.Repeat("x", 300)
	tests := []struct {
		name, body string
		v2         bool
		wantErr    string // substring naming the field; "" = valid
		check      func(t *testing.T, b rest.NewSandbox)
	}{
		{name: "minimal v2", body: `{"templateID":"base"}`, v2: true},
		{name: "missing template", body: `{}`, wantErr: "templateID"},
		{name: "blank template", body: `{"templateID":"  "}`, wantErr: "templateID"},
		{name: "template wrong type", body: `{"templateID":5}`, wantErr: "templateID"},
		{name: "zero timeout (E2B: expires at once)", body: `{"templateID":"base","timeout":0}`},
		{name: "negative timeout", body: `{"templateID":"base","timeout":-5}`, wantErr: "timeout"},
		{name: "huge timeout", body: `{"templateID":"base","timeout":99999999999}`, wantErr: "timeout"},
		{name: "timeout as string", body: `{"templateID":"base","timeout":"10"}`, wantErr: "timeout"},
		{name: "bad env name", body: `{"templateID":"base","envVars":{"A=B":"x"}}`, wantErr: "envVars"},
		{name: "env NUL", body: `{"templateID":"base","envVars":{"A":"x\u0000y"}}`, wantErr: "envVars.A"},
		{name: "metadata key too long", body: `{"templateID":"base","metadata":{"` + long + `":"v"}}`, wantErr: "metadata"},
		{name: "metadata wrong type", body: `{"templateID":"base","metadata":{"a":1}}`, wantErr: "metadata"},
		{name: "allowOut address", body: `{"templateID":"base","network":{"allowOut":["1.1.1.1"],"denyOut":["ALL_TRAFFIC"]}}`},
		{name: "allowOut domains", body: `{"templateID":"base","network":{"allowOut":["example.com","*.example.org","10.0.0.0/8"],"denyOut":["0.0.0.0/0"]}}`},
		{name: "allowOut bad CIDR", body: `{"templateID":"base","network":{"allowOut":["1.1.1.1","300.1.1.0/24"]}}`, wantErr: `network.allowOut[1]: "300.1.1.0/24"`},
		{name: "allowOut bad domain", body: `{"templateID":"base","network":{"allowOut":["exa mple.com"],"denyOut":["ALL_TRAFFIC"]}}`, wantErr: `network.allowOut[0]: "exa mple.com"`},
		{name: "domains need deny all", body: `{"templateID":"base","network":{"allowOut":["example.com"]}}`, wantErr: "network.allowOut: domains"},
		{name: "denyOut domain", body: `{"templateID":"base","network":{"denyOut":["8.8.8.8","example.com"]}}`, wantErr: `network.denyOut[1]: "example.com"`},
		{name: "denyOut IPv6", body: `{"templateID":"base","network":{"denyOut":["::/0"]}}`, wantErr: `network.denyOut[0]`},
		{name: "rules bad domain", body: `{"templateID":"base","network":{"rules":{"*":[{"transform":{"headers":{"A":"b"}}}]}}}`, wantErr: `network.rules["*"]`},
		{name: "rules bad header", body: `{"templateID":"base","network":{"rules":{"api.example.com":[{"transform":{"headers":{"Host":"evil"}}}]}}}`, wantErr: `network.rules["api.example.com"][0].transform.headers["Host"]`},
		{name: "rules header CRLF", body: `{"templateID":"base","network":{"rules":{"api.example.com":[{"transform":{"headers":{"X":"a\r\nB: c"}}}]}}}`, wantErr: `transform.headers["X"]`},
		{name: "egress proxy address", body: `{"templateID":"base","network":{"egressProxy":{"address":"no-port"}}}`, wantErr: "network.egressProxy.address"},
		{name: "private traffic needs secure", body: `{"templateID":"base","network":{"allowPublicTraffic":false}}`, wantErr: "network.allowPublicTraffic"},
		{name: "private traffic v2", body: `{"templateID":"base","network":{"allowPublicTraffic":false}}`, v2: true},
		{name: "https port envd", body: `{"templateID":"base","network":{"httpsPorts":[49983]}}`, wantErr: "network.httpsPorts"},
		{name: "autoPause", body: `{"templateID":"base","autoPause":true,"autoResume":{"enabled":true}}`},
		{name: "autoResume without memory", body: `{"templateID":"base","autoPause":true,"autoPauseMemory":false,"autoResume":{"enabled":true}}`, wantErr: "autoResume"},
		{name: "autoPauseMemory alone", body: `{"templateID":"base","autoPauseMemory":false}`, wantErr: "autoPauseMemory"},
		{name: "negative idleTimeout", body: `{"templateID":"base","idleTimeout":-1}`, wantErr: "idleTimeout"},
		{name: "deny all", body: `{"templateID":"base","network":{"denyOut":["0.0.0.0/0"]}}`},
		{name: "not json", body: `{"templateID":`, wantErr: "not valid JSON"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := decodeString(t, tc.body, 1<<20)
			if err == nil {
				_, err = s.createRequest(context.Background(), b, tc.v2)
			}
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v does not name %q", err, tc.wantErr)
			}
			if httperr.Status(err) != http.StatusBadRequest {
				t.Fatalf("status %d, want 400", httperr.Status(err))
			}
		})
	}
}

func TestCreateDefaults(t *testing.T) {
	s := &Server{}
	for _, tc := range []struct {
		v2     bool
		want   time.Duration
		secure bool
	}{{false, 15 * time.Second, false}, {true, 300 * time.Second, true}} {
		b, _ := decodeString(t, `{"templateID":"base"}`, 1<<20)
		req, err := s.createRequest(context.Background(), b, tc.v2)
		if err != nil || req.Timeout != tc.want || req.Secure != tc.secure || !req.AllowInternet {
			t.Errorf("v2=%v: %+v, %v", tc.v2, req, err)
		}
	}
	b, _ := decodeString(t, `{"templateID":"base","allow_internet_access":false,"secure":true}`, 1<<20)
	req, _ := s.createRequest(context.Background(), b, false)
	if req.AllowInternet || !req.Secure {
		t.Errorf("allow_internet_access/secure not honoured: %+v", req)
	}
}

func TestBodyTooLarge(t *testing.T) {
	_, err := decodeString(t, `{"templateID":"`+strings.Repeat("a", 2000)+`"}`, 1000)
	if !errors.Is(err, errdefs.ErrTooLarge) || httperr.Status(err) != http.StatusRequestEntityTooLarge || !strings.Contains(err.Error(), "1000") {
		t.Fatalf("got %v", err)
	}
}

func TestListQuery(t *testing.T) {
	q := url.Values{"metadata": {"user=abc&app=prod"}, "state": {"running,paused"}, "limit": {"2"}}
	lq, err := parseListQuery(q, true)
	if err != nil || lq.metadata["user"] != "abc" || lq.metadata["app"] != "prod" || len(lq.states) != 2 || lq.limit != 2 {
		t.Fatalf("%+v %v", lq, err)
	}
	for _, bad := range []url.Values{{"state": {"dead"}}, {"limit": {"0"}}, {"limit": {"101"}}, {"nextToken": {"!!"}}, {"order": {"up"}}} {
		if _, err := parseListQuery(bad, true); httperr.Status(err) != http.StatusBadRequest {
			t.Errorf("%v: got %v, want 400", bad, err)
		}
	}
}

func TestListFilters(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	sb := &sandbox.Sandbox{ID: "i1", TemplateID: "tpl1", Alias: "base", State: sandbox.StateRunning, StartedAt: t0,
		Metadata: map[string]string{"a&b": "x=y", "path": "/srv/data", "who": "Zoë Müller", "sp ace": "v v"}}
	// What the SDKs send: each key and value URL-encoded, the pairs as a
	// URL-encoded query string, encoded again as one query parameter.
	md := func(kv ...string) string {
		v := url.Values{}
		for i := 0; i < len(kv); i += 2 {
			v.Set(url.QueryEscape(kv[i]), url.QueryEscape(kv[i+1]))
		}
		return v.Encode()
	}
	tests := []struct {
		name  string
		query url.Values
		match bool
	}{
		{"no filter", url.Values{}, true},
		{"metadata with & and =", url.Values{"metadata": {md("a&b", "x=y")}}, true},
		{"metadata with / and non-ASCII", url.Values{"metadata": {md("path", "/srv/data", "who", "Zoë Müller")}}, true},
		{"metadata with spaces", url.Values{"metadata": {md("sp ace", "v v")}}, true},
		{"metadata value differs", url.Values{"metadata": {md("a&b", "x")}}, false},
		{"metadata key prefix is not the key", url.Values{"metadata": {md("a", "x=y")}}, false},
		{"template by id", url.Values{"template": {"tpl1"}}, true},
		{"template by alias", url.Values{"template": {"base"}}, true},
		{"other template", url.Values{"template": {"tpl2"}}, false},
		{"startedAfter, inclusive", url.Values{"startedAfter": {t0.Format(time.RFC3339)}}, true},
		{"startedAfter later", url.Values{"startedAfter": {t0.Add(time.Second).Format(time.RFC3339)}}, false},
		{"startedBefore later", url.Values{"startedBefore": {t0.Add(time.Second).Format(time.RFC3339)}}, true},
		{"startedBefore, exclusive", url.Values{"startedBefore": {t0.Format(time.RFC3339)}}, false},
		{"state paused", url.Values{"state": {"paused"}}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lq, err := parseListQuery(tc.query, true)
			if err != nil {
				t.Fatal(err)
			}
			if got := lq.match(sb); got != tc.match {
				t.Errorf("match = %v, want %v (%+v)", got, tc.match, lq)
			}
		})
	}
	if _, err := parseListQuery(url.Values{"startedAfter": {"yesterday"}}, true); httperr.Status(err) != http.StatusBadRequest || !strings.Contains(err.Error(), "startedAfter") {
		t.Errorf("bad startedAfter: %v, want a 400 naming the field", err)
	}
}

func TestAuthentication(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	team, _ := st.EnsureTeam(ctx, "a")
	key, _, _ := st.CreateAPIKey(ctx, team.ID, "")
	s := New(slog.New(slog.DiscardHandler), st, nil, nil)
	h := s.Handler()
	for _, tc := range []struct {
		name   string
		header map[string]string
		want   int
	}{
		{"no key", nil, 401},
		{"wrong key", map[string]string{"X-API-Key": "e2b_00"}, 401},
		{"huge key", map[string]string{"X-API-Key": strings.Repeat("a", 5000)}, 401},
		{"good key", map[string]string{"X-API-Key": key}, 200},
		{"bearer", map[string]string{"Authorization": "Bearer " + key}, 200},
	} {
		r := httptest.NewRequest(http.MethodGet, "/sandboxes?state=running", nil)
		for k, v := range tc.header {
			r.Header.Set(k, v)
		}
		w := httptest.NewRecorder()
		// /sandboxes with a nil manager would panic past auth; use a route
		// that fails validation after auth instead.
		r.URL.RawQuery = "state=bogus"
		h.ServeHTTP(w, r)
		want := tc.want
		if want == 200 {
			want = 400 // authenticated, then the bad state is refused
		}
		if w.Code != want {
			t.Errorf("%s: status %d, want %d: %s", tc.name, w.Code, want, w.Body)
		}
		var body rest.Error
		data, _ := io.ReadAll(w.Body)
		if err := json.Unmarshal(data, &body); err != nil || body.Code != want || body.Message == "" {
			t.Errorf("%s: body %s is not {code,message}", tc.name, data)
		}
	}
}

// TestMCPAuthentication: /mcp is behind the same key check as the REST
// routes, and the MCP handler sees only authenticated requests.
func TestMCPAuthentication(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	team, _ := st.EnsureTeam(ctx, "a")
	key, _, _ := st.CreateAPIKey(ctx, team.ID, "")
	s := New(slog.New(slog.DiscardHandler), st, nil, nil)
	var reached []string
	s.SetMCP(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached = append(reached, keyOf(r.Context()).TeamID)
		w.WriteHeader(http.StatusAccepted)
	}))
	h := s.Handler()
	for _, tc := range []struct {
		name   string
		header map[string]string
		want   int
	}{
		{"no key", nil, http.StatusUnauthorized},
		{"wrong key", map[string]string{"X-API-Key": "e2b_00"}, http.StatusUnauthorized},
		{"wrong bearer", map[string]string{"Authorization": "Bearer e2b_00"}, http.StatusUnauthorized},
		{"good key", map[string]string{"X-API-Key": key}, http.StatusAccepted},
		{"bearer", map[string]string{"Authorization": "Bearer " + key}, http.StatusAccepted},
	} {
		r := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(`{}`))
		for k, v := range tc.header {
			r.Header.Set(k, v)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != tc.want {
			t.Errorf("%s: status %d, want %d: %s", tc.name, w.Code, tc.want, w.Body)
		}
	}
	if len(reached) != 2 || reached[0] != team.ID || reached[1] != team.ID {
		t.Errorf("MCP handler reached by %v, want the two authenticated requests of team %s", reached, team.ID)
	}
}

// FuzzCreateBody: no body makes decoding or validation panic, and every
// rejection is a client error with a message.
func FuzzCreateBody(f *testing.F) {
	for _, seed := range []string{`{"templateID":"base"}`, `{"templateID":"base","timeout":-1}`, `{"metadata":{"a":"b"}}`, `[]`, `null`, `{"envVars":{"":""}}`} {
		f.Add(seed)
	}
	s := &Server{MaxBody: 1 << 16}
	f.Fuzz(func(t *testing.T, body string) {
		var b rest.NewSandbox
		r := httptest.NewRequest(http.MethodPost, "/v2/sandboxes", strings.NewReader(body))
		err := apireq.DecodeJSON(httptest.NewRecorder(), r, s.MaxBody, false, &b)
		if err == nil {
			_, err = s.createRequest(context.Background(), b, true)
		}
		if err != nil {
			if st := httperr.Status(err); st < 400 || st > 499 {
				t.Fatalf("status %d for %q: %v", st, body, err)
			}
			if httperr.Message(err) == "" {
				t.Fatal("empty message")
			}
		}
	})
}
