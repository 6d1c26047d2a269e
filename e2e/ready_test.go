package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
	"github.com/agentbox/agentbox/e2e/wire"
)

// TestOperatorEndpoints runs a server of its own (it takes the network
// down) with --log-format json and metrics: /ready answers 200 while
// sandboxes can be made, 503 naming the cause when the bridge is down, 200
// again after; /metrics counts a create for the operator's token only (an
// API key is no way in) and on --metrics-listen; every log line is a JSON
// object.
func TestOperatorEndpoints(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := l.Addr().String()
	l.Close()
	const token = "operator-metrics-token"
	s := harness.Start(t, harness.Name("ready"), harness.Args("--log-format", "json", "--metrics-token", token, "--metrics-listen", metricsAddr))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	c := wire.New(s.URL, s.APIKey)
	sb, err := c.Create(ctx, wire.CreateRequest{TemplateID: "base", Timeout: 120})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if r, err := c.Run(ctx, sb, "", "true"); err != nil || r.ExitCode != 0 {
		t.Fatalf("run through the gateway: %v %+v", err, r)
	}
	if err := c.Kill(ctx, sb.SandboxID); err != nil {
		t.Errorf("kill: %v", err)
	}
	scrape := func(url, auth string) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, auth := range []string{"", "Bearer " + s.APIKey, "Bearer wrong"} {
		if code, body := scrape(s.URL+"/metrics", auth); code != http.StatusUnauthorized {
			t.Errorf("/metrics with %q: %d %.200s, want 401", auth, code, body)
		}
	}
	for _, src := range []struct{ url, auth string }{{s.URL + "/metrics", "Bearer " + token}, {"http://" + metricsAddr + "/metrics", ""}} {
		code, body := scrape(src.url, src.auth)
		if code != http.StatusOK || !strings.Contains(body, `agentbox_sandbox_start_seconds_count{isolation="container",path="create",result="ok",template="`) ||
			!strings.Contains(body, `agentbox_gateway_requests_total{code="2xx",target="envd"}`) {
			t.Errorf("%s: %d, want 200 counting the create and its envd traffic:\n%s", src.url, code, grepLines(body, "agentbox_"))
		}
	}

	ready := func() (int, map[string]any) {
		t.Helper()
		code, body, err := s.Do(ctx, "", http.MethodGet, "/ready", nil)
		if err != nil {
			t.Fatalf("GET /ready: %v", err)
		}
		if strings.Contains(string(body), s.DataDir) {
			t.Errorf("/ready (unauthenticated) shows the server's data dir: %s", body)
		}
		var m map[string]any
		if err := json.Unmarshal(body, &m); err != nil {
			t.Fatalf("GET /ready: %d %s: %v", code, body, err)
		}
		return code, m
	}
	code, m := ready()
	iso, _ := m["isolation"].(map[string]any)
	if code != http.StatusOK || m["ready"] != true || m["store"] != "ok" || m["network"] != "ok" || iso["container"] != "ok" {
		t.Fatalf("fresh server: /ready %d %v", code, m)
	}
	if _, ok := iso["gvisor"]; !ok {
		t.Errorf("/ready does not report the gvisor tier: %v", m)
	}

	if out, err := exec.CommandContext(ctx, "ip", "link", "set", s.Bridge, "down").CombinedOutput(); err != nil {
		t.Fatalf("ip link set down: %v: %s", err, out)
	}
	code, m = ready()
	if code != http.StatusServiceUnavailable || m["ready"] != false || !strings.Contains(m["network"].(string), s.Bridge) {
		t.Errorf("bridge down: /ready %d %v, want 503 naming %s", code, m, s.Bridge)
	}
	if out, err := exec.CommandContext(ctx, "ip", "link", "set", s.Bridge, "up").CombinedOutput(); err != nil {
		t.Fatalf("ip link set up: %v: %s", err, out)
	}
	if code, m = ready(); code != http.StatusOK {
		t.Errorf("bridge up again: /ready %d %v", code, m)
	}

	f, err := os.Open(s.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	lines := 0
	for sc.Scan() {
		if sc.Text() == "" || strings.HasPrefix(sc.Text(), "===== serve ") {
			continue // the harness's marker between runs
		}
		var obj map[string]any
		if err := json.Unmarshal(sc.Bytes(), &obj); err != nil || obj["msg"] == nil {
			t.Errorf("--log-format json wrote a line that is not a JSON log record: %q", sc.Text())
		}
		lines++
	}
	if lines == 0 {
		t.Error("the server logged nothing")
	}
}

// grepLines keeps the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
