package outside

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestTenantMCPAttacks: a key of another team calls every MCP tool of /mcp
// that names a sandbox of team A. Each must fail as for a sandbox that does
// not exist (same words) and leave the sandbox untouched.
func TestTenantMCPAttacks(t *testing.T) {
	s := server(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	id := s.teamASandbox(ctx, t)
	const unknown = "i0000000000000000000"

	// tool calls a tool in one stateless JSON-RPC exchange and returns
	// whether it failed and its text.
	tool := func(key, name string, args map[string]any) (bool, string, error) {
		body := map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": map[string]any{"name": name, "arguments": args}}
		st, b, err := s.DoHeader(ctx, key, http.MethodPost, "/mcp", body, http.Header{"Accept": {"application/json, text/event-stream"}})
		if err != nil {
			return false, "", err
		}
		if st != http.StatusOK {
			return false, "", fmt.Errorf("POST /mcp: %d %.200s", st, b)
		}
		// An SSE answer carries the JSON-RPC response on its data line.
		for line := range bytes.SplitSeq(b, []byte("\n")) {
			if d, ok := bytes.CutPrefix(line, []byte("data: ")); ok {
				b = d
			}
		}
		var resp struct {
			Result struct {
				IsError bool `json:"isError"`
				Content []struct {
					Text string `json:"text"`
				} `json:"content"`
				Structured json.RawMessage `json:"structuredContent"`
			} `json:"result"`
		}
		if err := json.Unmarshal(b, &resp); err != nil {
			return false, "", fmt.Errorf("answer of %s: %w: %.200s", name, err, b)
		}
		var text strings.Builder
		for _, c := range resp.Result.Content {
			text.WriteString(c.Text)
		}
		return resp.Result.IsError, text.String(), nil
	}
	stillRunning := func() error {
		st, b, err := s.Do(ctx, s.APIKey, http.MethodGet, "/sandboxes/"+id, nil)
		if err != nil {
			return err
		}
		if st != http.StatusOK || jsonField(t, b, "state") != "running" {
			return crossed("team A's sandbox changed after the attack: %d %s", st, b)
		}
		return nil
	}
	calls := []struct {
		name string
		args map[string]any
	}{
		{"run_command", map[string]any{"cmd": "touch /tmp/crossed"}},
		{"run_code", map[string]any{"code": "1"}},
		{"read_file", map[string]any{"path": "/etc/hostname"}},
		{"write_file", map[string]any{"path": "/tmp/crossed", "content": "x"}},
		{"list_files", map[string]any{"path": "/"}},
		{"expose_port", map[string]any{"port": 8080}},
		{"pause_sandbox", map[string]any{}},
		{"resume_sandbox", map[string]any{}},
		{"kill_sandbox", map[string]any{}},
	}
	var attacks []attack
	for _, c := range calls {
		attacks = append(attacks, attack{
			side: sideTenant,
			name: "other team MCP " + c.name + " {id}",
			run: func(t *testing.T) error {
				args := func(sbx string) map[string]any {
					a := map[string]any{"sandboxId": sbx}
					for k, v := range c.args {
						a[k] = v
					}
					return a
				}
				failed, text, err := tool(s.OtherKey, c.name, args(id))
				if err != nil {
					return err
				}
				ufailed, utext, err := tool(s.OtherKey, c.name, args(unknown))
				if err != nil {
					return err
				}
				switch {
				case !failed:
					return crossed("%s on team A's sandbox succeeded: %.100s", c.name, text)
				case !ufailed || strings.ReplaceAll(text, id, unknown) != utext:
					return crossed("existence oracle: %q for team A's sandbox, %q for none", text, utext)
				}
				return stillRunning()
			},
		})
	}
	attacks = append(attacks, attack{
		side: sideTenant,
		name: "other team MCP list_sandboxes",
		run: func(t *testing.T) error {
			failed, text, err := tool(s.OtherKey, "list_sandboxes", map[string]any{})
			if err != nil {
				return err
			}
			if failed {
				return fmt.Errorf("list_sandboxes failed: %s", text)
			}
			if strings.Contains(text, id) {
				return crossed("list_sandboxes shows team A's sandbox")
			}
			return nil
		},
	}, attack{
		side: sideTenant,
		name: "MCP without an API key",
		run: func(t *testing.T) error {
			st, b, err := s.DoHeader(ctx, "", http.MethodPost, "/mcp",
				map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": map[string]any{"name": "list_sandboxes", "arguments": map[string]any{}}},
				http.Header{"Accept": {"application/json, text/event-stream"}})
			if err != nil {
				return err
			}
			if st != http.StatusUnauthorized {
				return crossed("answered %d %.100s", st, b)
			}
			return nil
		},
	})
	runAttacks(t, attacks)
	// Team A's own key does reach it: the refusals above are about the key.
	failed, text, err := tool(s.APIKey, "run_command", map[string]any{"sandboxId": id, "cmd": "test ! -e /tmp/crossed && echo clean"})
	if err != nil || failed || !strings.Contains(text, "clean") {
		t.Fatalf("team A's run_command: failed=%v %q %v", failed, text, err)
	}
}
