package metrics

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/sandbox"
)

type source struct{}

func (source) StateCounts() []sandbox.StateCount {
	return []sandbox.StateCount{{State: sandbox.StateRunning, Isolation: "container", Count: 3}, {State: sandbox.StatePaused, Isolation: "gvisor", Count: 1}}
}

func (source) Pools() []sandbox.PoolStats {
	return []sandbox.PoolStats{{Template: "base", Ready: 2, Target: 4, Hits: 7, Misses: 1}}
}

func scrape(t *testing.T, h http.Handler, auth string) (int, string) {
	t.Helper()
	r := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	if auth != "" {
		r.Header.Set("Authorization", auth)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	b, _ := io.ReadAll(w.Result().Body)
	return w.Code, string(b)
}

func TestMetrics(t *testing.T) {
	m := New(source{})
	m.Created("create", "", "base", true, 150*time.Millisecond, map[string]time.Duration{"attach-network": 20 * time.Millisecond})
	m.Created("create", "gvisor", "base", false, time.Second, nil)
	m.Lifecycle("pause", true, 300*time.Millisecond)
	m.GatewayRequest("envd", 200)
	m.GatewayRequest("port", 502)

	h := m.Handler("s3cret")
	for _, auth := range []string{"", "Bearer wrong", "s3cret", "Basic s3cret", "Bearer s3cret "} {
		if code, _ := scrape(t, h, auth); code != http.StatusUnauthorized {
			t.Errorf("Authorization %q: %d, want 401", auth, code)
		}
	}
	code, body := scrape(t, h, "Bearer s3cret")
	if code != http.StatusOK {
		t.Fatalf("right token: %d %s", code, body)
	}
	for _, want := range []string{
		`agentbox_sandbox_start_seconds_count{isolation="container",path="create",result="ok",template="base"} 1`,
		`agentbox_sandbox_start_seconds_count{isolation="gvisor",path="create",result="error",template="base"} 1`,
		`agentbox_sandbox_start_step_seconds_count{path="create",step="attach-network"} 1`,
		`agentbox_lifecycle_seconds_count{op="pause",result="ok"} 1`,
		`agentbox_gateway_requests_total{code="2xx",target="envd"} 1`,
		`agentbox_gateway_requests_total{code="5xx",target="port"} 1`,
		`agentbox_sandboxes{isolation="container",state="running"} 3`,
		`agentbox_sandboxes{isolation="gvisor",state="paused"} 1`,
		`agentbox_pool_ready{template="base"} 2`,
		`agentbox_pool_claims_total{result="hit",template="base"} 7`,
		`go_goroutines`,
		`process_resident_memory_bytes`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("scrape lacks %s", want)
		}
	}
	if code, _ := scrape(t, m.Handler(""), ""); code != http.StatusOK {
		t.Errorf("tokenless handler (own listener): %d", code)
	}
}

// A team that makes templates without end must not grow the series count
// without end: past MaxTemplates they are all "other".
func TestTemplateLabelCap(t *testing.T) {
	m := New(source{})
	for i := range MaxTemplates + 20 {
		m.Created("create", "container", fmt.Sprintf("tpl-%d", i), true, time.Millisecond, nil)
	}
	if got := m.templateLabel("tpl-0"); got != "tpl-0" {
		t.Errorf("a known template became %q", got)
	}
	if got := m.templateLabel("new-one"); got != "other" {
		t.Errorf("template past the cap labelled %q, want other", got)
	}
	_, body := scrape(t, m.Handler(""), "")
	if n := strings.Count(body, "agentbox_sandbox_start_seconds_count{"); n != MaxTemplates+1 {
		t.Errorf("%d start series, want %d (the cap plus other)", n, MaxTemplates+1)
	}
}
