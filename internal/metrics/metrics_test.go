package metrics

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/sandbox"
)

type source struct{ n int }

func (s source) LatestSamples() []sandbox.Latest {
	out := []sandbox.Latest{}
	for i := range s.n {
		out = append(out, sandbox.Latest{ID: fmt.Sprintf("sb%03d", i), TeamID: "team-a", Sampled: true, CPUSeconds: 1.5, MemUsed: 1 << 20, DiskUsed: 4096})
	}
	return out
}

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

func TestEgressAndBuilds(t *testing.T) {
	m := New(source{n: 1})
	m.EgressDone(egress.Decision{TeamID: "team-a", SandboxID: "sb000", Allowed: true, Reason: "default", Sent: 100, Received: 5000})
	m.EgressDone(egress.Decision{TeamID: "team-a", SandboxID: "sb000", Reason: "deny_out"})
	m.BuildDone(true, 42*time.Second)
	_, body := scrape(t, m.Handler(""), "")
	for _, want := range []string{
		`agentbox_egress_decisions_total{decision="allow",reason="default"} 1`,
		`agentbox_egress_decisions_total{decision="deny",reason="deny_out"} 1`,
		`agentbox_egress_bytes_total{direction="in"} 5000`,
		`agentbox_egress_bytes_total{direction="out"} 100`,
		`agentbox_template_build_seconds_count{result="ok"} 1`,
		`agentbox_sandbox_cpu_seconds_total{sandbox="sb000",team="team-a"} 1.5`,
		`agentbox_sandbox_memory_bytes{sandbox="sb000",team="team-a"} 1.048576e+06`,
		`agentbox_sandbox_disk_bytes{sandbox="sb000",team="team-a"} 4096`,
		`agentbox_sandbox_network_bytes_total{direction="in",sandbox="sb000",team="team-a"} 5000`,
		`agentbox_sandbox_series_omitted 0`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("scrape lacks %s", want)
		}
	}
}

// Per-sandbox series stop at the cap; the rest are counted, not exported.
func TestSandboxSeriesCap(t *testing.T) {
	for _, tc := range []struct{ sandboxes, max, series, omitted int }{
		{3, 10, 3, 0},
		{30, 10, 10, 20},
		{5, 0, 0, -1},
	} {
		m := New(source{n: tc.sandboxes})
		m.SetMaxSandboxSeries(tc.max)
		_, body := scrape(t, m.Handler(""), "")
		if n := strings.Count(body, "agentbox_sandbox_memory_bytes{"); n != tc.series {
			t.Errorf("%d sandboxes, cap %d: %d series, want %d", tc.sandboxes, tc.max, n, tc.series)
		}
		if tc.omitted >= 0 && !strings.Contains(body, fmt.Sprintf("agentbox_sandbox_series_omitted %d\n", tc.omitted)) {
			t.Errorf("%d sandboxes, cap %d: omitted count not %d", tc.sandboxes, tc.max, tc.omitted)
		}
	}
}

// A sandbox not sampled yet has no CPU, memory or disk series, but its
// network bytes are kept from its first connection; a sandbox gone is
// dropped.
type unsampled struct {
	source
	gone bool
}

func (u *unsampled) LatestSamples() []sandbox.Latest {
	if u.gone {
		return nil
	}
	return []sandbox.Latest{{ID: "fresh", TeamID: "t"}}
}

func TestUnsampledSandbox(t *testing.T) {
	src := &unsampled{}
	m := New(src)
	m.EgressDone(egress.Decision{TeamID: "t", SandboxID: "fresh", Allowed: true, Reason: "default", Received: 10})
	_, body := scrape(t, m.Handler(""), "")
	if strings.Contains(body, `agentbox_sandbox_cpu_seconds_total{sandbox="fresh"`) {
		t.Error("an unsampled sandbox has a CPU series")
	}
	want := `agentbox_sandbox_network_bytes_total{direction="in",sandbox="fresh",team="t"} 10`
	if !strings.Contains(body, want) {
		t.Errorf("scrape lacks %s", want)
	}
	src.gone = true
	_, body = scrape(t, m.Handler(""), "")
	if strings.Contains(body, `sandbox="fresh"`) {
		t.Error("a removed sandbox keeps its series")
	}
}
