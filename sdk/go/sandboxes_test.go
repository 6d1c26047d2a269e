package agentbox

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/agentbox/agentbox/api/gen/rest"
	"github.com/agentbox/agentbox/internal/apireq"
)

// recorded is one request the fake control plane saw.
type recorded struct {
	method, path, query, apiKey string
	body                        map[string]any
}

// controlPlane answers with status and body for every request and records
// what it got.
func controlPlane(t *testing.T, status int, body any) (*httptest.Server, *[]recorded) {
	t.Helper()
	var reqs []recorded
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := recorded{method: r.Method, path: r.URL.Path, query: r.URL.RawQuery, apiKey: r.Header.Get("X-API-Key")}
		b, _ := io.ReadAll(r.Body)
		if len(b) > 0 {
			if err := json.Unmarshal(b, &rec.body); err != nil {
				t.Errorf("request body is not JSON: %q", b)
			}
		}
		reqs = append(reqs, rec)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		if body != nil {
			_ = json.NewEncoder(w).Encode(body)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, &reqs
}

var sandboxAnswer = map[string]any{
	"sandboxID": "iabc", "templateID": "t123", "alias": "base", "clientID": "6532622b",
	"envdVersion": "0.6.13", "envdAccessToken": "tok", "trafficAccessToken": nil, "domain": nil,
}

func TestCreate(t *testing.T) {
	no := false
	tests := []struct {
		name     string
		opts     CreateOptions
		wantPath string
		wantBody map[string]any
	}{
		{"defaults", CreateOptions{}, "/v2/sandboxes", map[string]any{"templateID": "base"}},
		{"everything", CreateOptions{
			Template: "py", Timeout: 1500 * time.Millisecond,
			Metadata: map[string]string{"a": "b"}, EnvVars: map[string]string{"X": "1"},
			AllowInternetAccess: &no,
			Network:             &rest.SandboxNetworkConfig{AllowOut: []string{"pypi.org"}, DenyOut: []string{"0.0.0.0/0"}},
		}, "/v2/sandboxes", map[string]any{
			"templateID": "py", "timeout": 2.0, "metadata": map[string]any{"a": "b"},
			"envVars": map[string]any{"X": "1"}, "allow_internet_access": false,
			"network": map[string]any{"allowOut": []any{"pypi.org"}, "denyOut": []any{"0.0.0.0/0"}},
		}},
		{"insecure uses v1", CreateOptions{Secure: &no}, "/sandboxes",
			map[string]any{"templateID": "base", "secure": false, "timeout": 300.0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, reqs := controlPlane(t, http.StatusCreated, sandboxAnswer)
			c := New(WithAPIURL(srv.URL+"/"), WithAPIKey("e2b_key"))
			sbx, err := c.Create(context.Background(), tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			if sbx.ID != "iabc" || sbx.TemplateID != "t123" || sbx.EnvdAccessToken != "tok" || sbx.Alias != "base" {
				t.Errorf("sandbox = %+v", sbx)
			}
			r := (*reqs)[0]
			if r.method != http.MethodPost || r.path != tt.wantPath || r.apiKey != "e2b_key" {
				t.Errorf("request %s %s key %q", r.method, r.path, r.apiKey)
			}
			a, _ := json.Marshal(r.body)
			b, _ := json.Marshal(tt.wantBody)
			if string(a) != string(b) {
				t.Errorf("body = %s, want %s", a, b)
			}
		})
	}
}

func TestErrors(t *testing.T) {
	tests := []struct {
		status int
		want   error
	}{
		{http.StatusNotFound, ErrNotFound},
		{http.StatusUnauthorized, ErrUnauthorized},
		{http.StatusBadRequest, ErrInvalid},
		{http.StatusConflict, ErrConflict},
		{http.StatusBadGateway, ErrUnavailable},
		{http.StatusTooManyRequests, ErrRateLimited},
	}
	for _, tt := range tests {
		t.Run(strconv.Itoa(tt.status), func(t *testing.T) {
			srv, _ := controlPlane(t, tt.status, map[string]any{"code": tt.status, "message": "the reason"})
			c := New(WithAPIURL(srv.URL))
			err := c.Kill(context.Background(), "iabc")
			if !errors.Is(err, tt.want) {
				t.Errorf("err = %v, want %v", err, tt.want)
			}
			var apiErr *APIError
			if !errors.As(err, &apiErr) || apiErr.Status != tt.status || apiErr.Message != "the reason" {
				t.Errorf("APIError = %+v", apiErr)
			}
			for _, other := range []error{ErrNotFound, ErrConflict} {
				if other != tt.want && errors.Is(err, other) {
					t.Errorf("%v also matches %v", err, other)
				}
			}
		})
	}
}

func TestList(t *testing.T) {
	var queries []url.Values
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v2/sandboxes" {
			t.Errorf("path %s", r.URL.Path)
		}
		q := r.URL.Query()
		queries = append(queries, q)
		if q.Get("nextToken") == "" {
			w.Header().Set("X-Next-Token", "page2")
			_ = json.NewEncoder(w).Encode([]map[string]any{{"sandboxID": "i1", "state": "running", "startedAt": "2026-09-30T10:00:00Z"}})
			return
		}
		_ = json.NewEncoder(w).Encode([]map[string]any{{"sandboxID": "i2", "state": "paused", "metadata": map[string]string{"user": "a b"}}})
	}))
	defer srv.Close()
	c := New(WithAPIURL(srv.URL))
	got, err := c.List(context.Background(), ListOptions{
		Metadata: map[string]string{"user": "a b", "app": "x&y=z/%+é"},
		State:    []string{"running", "paused"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].SandboxID != "i1" || got[1].State != "paused" || got[1].Metadata["user"] != "a b" {
		t.Errorf("list = %+v", got)
	}
	if !got[0].StartedAt.Equal(time.Date(2026, 9, 30, 10, 0, 0, 0, time.UTC)) {
		t.Errorf("startedAt = %v", got[0].StartedAt)
	}
	if len(queries) != 2 || queries[1].Get("nextToken") != "page2" {
		t.Fatalf("queries = %v", queries)
	}
	// The server decodes the filter as E2B's API does.
	f, err := apireq.ParseListFilters(queries[0])
	if err != nil || f.Metadata["user"] != "a b" || f.Metadata["app"] != "x&y=z/%+é" || len(f.Metadata) != 2 {
		t.Errorf("metadata filter = %q, decoded %v (%v)", queries[0].Get("metadata"), f.Metadata, err)
	}
	if queries[0].Get("state") != "running,paused" {
		t.Errorf("state = %q", queries[0].Get("state"))
	}

	queries = nil
	got, err = c.List(context.Background(), ListOptions{Limit: 1})
	if err != nil || len(got) != 1 || len(queries) != 1 || queries[0].Get("limit") != "1" {
		t.Errorf("limited list = %v, %v, queries %v", got, err, queries)
	}
}

func TestSandboxCalls(t *testing.T) {
	tests := []struct {
		name       string
		status     int
		answer     any
		call       func(*Client) error
		wantMethod string
		wantPath   string
		wantBody   string
	}{
		{"connect", 200, sandboxAnswer, func(c *Client) error {
			s, err := c.Connect(context.Background(), "iabc", time.Minute)
			if err == nil && s.EnvdAccessToken != "tok" {
				t.Errorf("token %q", s.EnvdAccessToken)
			}
			return err
		}, "POST", "/v2/sandboxes/iabc/connect", `{"timeout":60}`},
		{"info", 200, map[string]any{"sandboxID": "iabc", "cpuCount": 2, "memoryMB": 512, "state": "running"}, func(c *Client) error {
			info, err := c.GetInfo(context.Background(), "iabc")
			if err == nil && (info.CPUCount != 2 || info.MemoryMB != 512 || info.State != "running") {
				t.Errorf("info %+v", info)
			}
			return err
		}, "GET", "/sandboxes/iabc", `null`},
		{"kill", 204, nil, func(c *Client) error { return c.Kill(context.Background(), "iabc") },
			"DELETE", "/sandboxes/iabc", `null`},
		{"pause", 204, nil, func(c *Client) error { return c.Pause(context.Background(), "iabc") },
			"POST", "/sandboxes/iabc/pause", `null`},
		{"timeout", 204, nil, func(c *Client) error { return c.SetTimeout(context.Background(), "iabc", 30*time.Second) },
			"POST", "/sandboxes/iabc/timeout", `{"timeout":30}`},
		{"metrics", 200, []map[string]any{{"timestampUnix": 1790000000, "cpuUsedPct": 12.5, "memUsed": 1000}}, func(c *Client) error {
			m, err := c.Metrics(context.Background(), "iabc")
			if err == nil && (len(m) != 1 || m[0].CPUUsedPct != 12.5 || m[0].MemUsed != 1000 || m[0].Time().Unix() != 1790000000) {
				t.Errorf("metrics %+v", m)
			}
			return err
		}, "GET", "/sandboxes/iabc/metrics", `null`},
		{"templates", 200, []map[string]any{{"templateID": "t1", "aliases": []string{"base"}}}, func(c *Client) error {
			ts, err := c.ListTemplates(context.Background())
			if err == nil && (len(ts) != 1 || ts[0].Aliases[0] != "base") {
				t.Errorf("templates %+v", ts)
			}
			return err
		}, "GET", "/templates", `null`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, reqs := controlPlane(t, tt.status, tt.answer)
			if err := tt.call(New(WithAPIURL(srv.URL))); err != nil {
				t.Fatal(err)
			}
			r := (*reqs)[0]
			body, _ := json.Marshal(r.body)
			if r.method != tt.wantMethod || r.path != tt.wantPath || string(body) != tt.wantBody {
				t.Errorf("got %s %s %s, want %s %s %s", r.method, r.path, body, tt.wantMethod, tt.wantPath, tt.wantBody)
			}
		})
	}
}

func TestEnvDefaults(t *testing.T) {
	t.Setenv("AGENTBOX_API_URL", "")
	t.Setenv("E2B_API_URL", "http://e2b:1")
	t.Setenv("AGENTBOX_API_KEY", "")
	t.Setenv("E2B_API_KEY", "e2b_x")
	t.Setenv("AGENTBOX_SANDBOX_URL", "")
	t.Setenv("E2B_SANDBOX_URL", "")
	c := New()
	if c.apiURL != "http://e2b:1" || c.apiKey != "e2b_x" || c.sandboxURL != "http://e2b:1" {
		t.Errorf("client = %+v", c)
	}
	t.Setenv("AGENTBOX_API_URL", "http://ab:2/")
	if c := New(); c.apiURL != "http://ab:2" {
		t.Errorf("AGENTBOX_API_URL not preferred: %s", c.apiURL)
	}
	t.Setenv("AGENTBOX_API_URL", "")
	t.Setenv("E2B_API_URL", "")
	if c := New(); c.apiURL != DefaultAPIURL {
		t.Errorf("default = %s", c.apiURL)
	}
}
