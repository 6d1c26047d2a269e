package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// A team quota set with the CLI on the server's data dir applies to the
// team's next create, without a restart: a limit over it is a 400 naming
// the team quota, a create past maxSandboxes a 429 saying how to free room,
// and another team keeps the server's quota.
func TestTeamQuota(t *testing.T) {
	s := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	key := s.NewKey(t, "quota-e2e")
	team := func(args ...string) string {
		t.Helper()
		out, err := exec.CommandContext(ctx, s.Bin, append(append([]string{"team"}, args...), "--data-dir", s.DataDir)...).CombinedOutput()
		if err != nil {
			t.Fatalf("agentbox team %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	team("quota", "set", "quota-e2e", "--memory-mb", "512", "--max-sandboxes", "1")
	defer team("quota", "clear", "quota-e2e")
	if out := team("quota", "get", "quota-e2e"); !strings.Contains(out, "512") {
		t.Fatalf("quota get: %s", out)
	}

	create := func(key, body string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+"/sandboxes", bytes.NewBufferString(body))
		req.Header.Set("X-API-Key", key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&out)
		if id, _ := out["sandboxID"].(string); id != "" {
			c := s.client()
			c.APIKey = key
			t.Cleanup(func() { _ = c.Kill(context.Background(), id) })
		}
		return resp.StatusCode, out
	}
	msg := func(out map[string]any) string { m, _ := out["message"].(string); return m }

	if code, out := create(key, `{"templateID":"base","memoryMB":1024}`); code != http.StatusBadRequest ||
		!strings.Contains(msg(out), "memoryMB: 1024 MiB is over the team quota of 512 MiB") || out["code"] != float64(400) {
		t.Fatalf("over the team's memory quota: %d %v", code, out)
	}
	if code, out := create(key, `{"templateID":"base","memoryMB":256,"timeout":120}`); code != http.StatusCreated {
		t.Fatalf("within quota: %d %v", code, out)
	}
	if code, out := create(key, `{"templateID":"base","memoryMB":256,"timeout":120}`); code != http.StatusTooManyRequests ||
		!strings.Contains(msg(out), "its quota allows 1 at once") || !strings.Contains(msg(out), "kill one") || out["code"] != float64(429) {
		t.Fatalf("past maxSandboxes: %d %v", code, out)
	}
	// The other team is not affected by this team's quota.
	if code, out := create(s.otherKey, `{"templateID":"base","memoryMB":1024,"timeout":120}`); code != http.StatusCreated {
		t.Fatalf("other team: %d %v", code, out)
	}
	// Raising the cap applies to the next create.
	team("quota", "set", "quota-e2e", "--max-sandboxes", "2")
	if code, out := create(key, `{"templateID":"base","memoryMB":256,"timeout":120}`); code != http.StatusCreated {
		t.Fatalf("after raising maxSandboxes: %d %v", code, out)
	}
}
