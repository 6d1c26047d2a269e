package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
)

// TestReadinessAndJSONLogs runs a server of its own (it takes the network
// down) with --log-format json: /ready answers 200 while sandboxes can be
// made, 503 naming the cause when the bridge is down, 200 again after, and
// every log line is a JSON object.
func TestReadinessAndJSONLogs(t *testing.T) {
	s := harness.Start(t, harness.Name("ready"), harness.Args("--log-format", "json"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

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
