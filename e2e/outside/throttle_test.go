package outside

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// sideShared is a client sharing an address with other teams (the MCP
// server calling back over loopback, a NAT'd backend): whatever one team
// does from there, the others' valid credentials keep working.
const sideShared = "shared address"

// TestThrottleAttacks: wrong keys from an address never lock out a valid
// key from it, and what a sandbox answers on its own ports never counts as
// its caller's failed authentication. The server is this test's own:
// 127.0.0.1 is throttled on purpose.
func TestThrottleAttacks(t *testing.T) {
	srv := harness.Start(t, harness.Name("throttle"))
	s := &target{Server: srv, OtherKey: srv.NewKey(t, "throttle-b")}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// Team B's sandbox, with its access token.
	st, b, err := s.Do(ctx, s.OtherKey, http.MethodPost, "/v2/sandboxes", map[string]any{"templateID": "base", "timeout": 600})
	if err != nil || st != http.StatusCreated {
		t.Fatalf("team B creates a sandbox: %d %s %v", st, b, err)
	}
	id, token := jsonField(t, b, "sandboxID"), jsonField(t, b, "envdAccessToken")
	if token == "" {
		t.Fatalf("no envdAccessToken in %s", b)
	}
	t.Cleanup(func() { _, _, _ = s.Do(context.Background(), s.OtherKey, http.MethodDelete, "/sandboxes/"+id, nil) })

	loopback := from("127.0.0.1")
	// envd answers GET /envs with the token.
	envd := func(c *http.Client, port int, tok string) (int, string, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/envs", nil)
		req.Header.Set("E2b-Sandbox-Id", id)
		req.Header.Set("E2b-Sandbox-Port", fmt.Sprint(port))
		req.Header.Set("X-Access-Token", tok)
		return send(c, req)
	}
	rest := func(c *http.Client, key string) (int, string, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/v2/sandboxes", nil)
		req.Header.Set("X-API-Key", key)
		return send(c, req)
	}
	// burst sends wrong keys from c until they are answered 429 (the
	// throttle works), at most 60.
	burst := func(c *http.Client) error {
		for i := range 60 {
			st, body, err := rest(c, fmt.Sprintf("e2b_%040x", i))
			if err != nil {
				return err
			}
			switch st {
			case http.StatusUnauthorized:
			case http.StatusTooManyRequests:
				return nil
			default:
				return fmt.Errorf("wrong key %d: %d %.100s", i, st, body)
			}
		}
		return fmt.Errorf("60 wrong keys from one address, none answered 429")
	}
	// A sandbox's own port answers 401 to everything, the port the
	// gateway used to count for the interpreter's tokens included.
	sbx, err := agentbox.New(agentbox.WithAPIURL(s.URL), agentbox.WithSandboxURL(s.URL), agentbox.WithAPIKey(s.OtherKey)).Connect(ctx, id, 0)
	if err != nil {
		t.Fatal(err)
	}
	const deny401 = `import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(401); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("0.0.0.0", 49999), H).serve_forever()
`
	if _, err := sbx.Files.AsUser("root").Write(ctx, "/tmp/deny401.py", []byte(deny401)); err != nil {
		t.Fatal(err)
	}
	if _, err := sbx.Commands.Run(ctx, "nohup python3 /tmp/deny401.py >/dev/null 2>&1 &", agentbox.WithUser("root")); err != nil {
		t.Fatal(err)
	}
	caller := from("127.0.0.5")
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if st, _, _ := envd(caller, 49999, token); st == http.StatusUnauthorized {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the sandbox's 401 server did not come up on port 49999")
		}
	}
	if err := burst(loopback); err != nil {
		t.Fatalf("the burst: %v", err)
	}
	served := func(what string, st int, body string, err error) error {
		switch {
		case err != nil:
			return err
		case st == http.StatusTooManyRequests:
			return crossed("%s refused after another client's wrong keys from the same address: %d %.120s", what, st, body)
		case st != http.StatusOK:
			return fmt.Errorf("%s: %d %.120s", what, st, body)
		}
		return nil
	}
	// mcpServed has team B run a command over MCP from c: the MCP server
	// calls the API and envd back over loopback with B's key and token.
	mcpServed := func(c *http.Client) error {
		st, isErr, text, err := mcpCallFrom(ctx, c, s.Server, s.OtherKey, "run_command", map[string]any{"sandboxId": id, "cmd": "echo served"})
		if err == nil && st == http.StatusOK && (isErr || !strings.Contains(text, "served")) {
			if strings.Contains(text, "429") || strings.Contains(text, "too many failed") {
				return crossed("team B's MCP call was throttled: %.160s", text)
			}
			return fmt.Errorf("run_command: %.160s", text)
		}
		return served("team B's MCP call", st, text, err)
	}
	attacks := []attack{
		{side: sideShared, name: "wrong keys from 127.0.0.1, then team B's key on REST", run: func(t *testing.T) error {
			st, body, err := rest(loopback, s.OtherKey)
			return served("team B's valid key", st, body, err)
		}},
		{side: sideShared, name: "wrong keys from 127.0.0.1, then team B's token on envd", run: func(t *testing.T) error {
			st, body, err := envd(loopback, agentbox.EnvdPort, token)
			return served("team B's valid access token", st, body, err)
		}},
		{side: sideShared, name: "wrong keys from 127.0.0.1, then team B's MCP call from there", run: func(t *testing.T) error {
			return mcpServed(loopback)
		}},
		{side: sideShared, name: "wrong keys from 127.0.0.1, then team B's MCP call from elsewhere (it calls back over loopback)", run: func(t *testing.T) error {
			return mcpServed(from("127.0.0.6"))
		}},
	}

	attacks = append(attacks, attack{side: sideShared, name: "a sandbox port answers 401 to 60 requests, then the caller's key", run: func(t *testing.T) error {
		for i := range 60 {
			st, body, err := envd(caller, 49999, token)
			if err != nil {
				return err
			}
			if st == http.StatusTooManyRequests {
				return crossed("the sandbox's 401s throttled its caller after %d requests: %.120s", i, body)
			}
		}
		st, body, err := rest(caller, s.OtherKey)
		if err := served("the caller's valid key", st, body, err); err != nil {
			return err
		}
		st, body, err = envd(caller, agentbox.EnvdPort, token)
		if err := served("the caller's valid token", st, body, err); err != nil {
			return err
		}
		// Nothing was counted: the caller's own wrong key is still 401.
		if st, body, err := rest(caller, "e2b_wrong"); err != nil || st != http.StatusUnauthorized {
			return crossed("the sandbox's 401s counted against its caller: a wrong key then got %d %.120s %v", st, body, err)
		}
		return nil
	}})
	runAttacks(t, attacks)
}

// send does req with c and returns the status and (the start of) the body.
func send(c *http.Client, req *http.Request) (int, string, error) {
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	return resp.StatusCode, string(body), nil
}

// mcpCall calls an MCP tool of /mcp with key in one stateless JSON-RPC
// exchange and returns the HTTP status, whether the tool failed, and its
// text (the HTTP body when the status is not 200).
func mcpCall(ctx context.Context, s *harness.Server, key, name string, args map[string]any) (int, bool, string, error) {
	return mcpCallFrom(ctx, http.DefaultClient, s, key, name, args)
}

// mcpCallFrom is mcpCall with the client c (e.g. from(ip)).
func mcpCallFrom(ctx context.Context, c *http.Client, s *harness.Server, key, name string, args map[string]any) (int, bool, string, error) {
	raw, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": map[string]any{"name": name, "arguments": args}})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+"/mcp", bytes.NewReader(raw))
	if err != nil {
		return 0, false, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("X-API-Key", key)
	resp, err := c.Do(req)
	if err != nil {
		return 0, false, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return resp.StatusCode, false, string(b), err
	}
	for line := range bytes.SplitSeq(b, []byte("\n")) {
		if d, ok := bytes.CutPrefix(line, []byte("data: ")); ok {
			b = d
		}
	}
	var out struct {
		Result struct {
			IsError bool `json:"isError"`
			Content []struct {
				Text string `json:"text"`
			} `json:"content"`
		} `json:"result"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return resp.StatusCode, false, "", fmt.Errorf("answer of %s: %w: %.200s", name, err, b)
	}
	var text strings.Builder
	for _, c := range out.Result.Content {
		text.WriteString(c.Text)
	}
	return resp.StatusCode, out.Result.IsError, text.String(), nil
}
