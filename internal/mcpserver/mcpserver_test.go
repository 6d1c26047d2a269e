package mcpserver

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// connect serves the tools to an in-process MCP client; the API behind
// them is a server counting the requests it gets.
func connect(t *testing.T) (*mcp.ClientSession, *atomic.Int32) {
	t.Helper()
	var hits atomic.Int32
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		http.Error(w, `{"code":404,"message":"sandbox nope not found"}`, http.StatusNotFound)
	}))
	t.Cleanup(api.Close)
	c := agentbox.New(agentbox.WithAPIURL(api.URL), agentbox.WithAPIKey("k"))
	srv := New(Config{Client: c, PublicURL: api.URL})
	st, ct := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(t.Context(), st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(t.Context(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs, &hits
}

func call(t *testing.T, cs *mcp.ClientSession, tool string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	return res
}

func text(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// TestValidation: bad arguments are refused with the reason, before any
// request reaches the API.
func TestValidation(t *testing.T) {
	cs, hits := connect(t)
	for _, tc := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"run_command", map[string]any{"sandboxId": "i1"}, `missing properties: ["cmd"]`},
		{"run_command", map[string]any{"sandboxId": "", "cmd": "true"}, "sandboxId is required"},
		{"run_command", map[string]any{"sandboxId": "i1", "cmd": ""}, "cmd is required"},
		{"run_command", map[string]any{"sandboxId": "i1", "cmd": "true", "timeoutSeconds": -1}, "timeoutSeconds -1"},
		{"run_code", map[string]any{"sandboxId": "i1", "code": "1", "language": "python", "contextId": "c"}, "not both"},
		{"run_code", map[string]any{"sandboxId": "i1", "code": ""}, "code is required"},
		{"create_sandbox", map[string]any{"timeoutSeconds": -5}, "timeoutSeconds -5"},
		{"list_sandboxes", map[string]any{"state": "dead"}, `state "dead"`},
		{"kill_sandbox", map[string]any{"sandboxId": ""}, "sandboxId is required"},
		{"pause_sandbox", map[string]any{}, `missing properties: ["sandboxId"]`},
		{"resume_sandbox", map[string]any{"sandboxId": "i1", "timeoutSeconds": -1}, "timeoutSeconds -1"},
		{"read_file", map[string]any{"sandboxId": "i1", "path": ""}, "path is required"},
		{"write_file", map[string]any{"sandboxId": "i1", "path": "/a", "content": "%%", "encoding": "base64"}, "not base64"},
		{"write_file", map[string]any{"sandboxId": "i1", "path": "/a", "content": "x", "encoding": "latin1"}, `encoding "latin1"`},
		{"list_files", map[string]any{"sandboxId": "i1", "path": "/", "depth": -1}, "depth -1"},
		{"expose_port", map[string]any{"sandboxId": "i1", "port": 0}, "port 0"},
		{"expose_port", map[string]any{"sandboxId": "i1", "port": 70000}, "port 70000"},
		{"expose_port", map[string]any{"sandboxId": "i1", "port": agentbox.EnvdPort}, "envd's"},
		{"run_command", map[string]any{"sandboxId": "i1", "cmd": 7}, "validating"},
	} {
		res := call(t, cs, tc.tool, tc.args)
		if !res.IsError || !strings.Contains(text(res), tc.want) {
			t.Errorf("%s %v: got error=%v %q, want an error containing %q", tc.tool, tc.args, res.IsError, text(res), tc.want)
		}
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("refused calls sent %d requests to the API", n)
	}
}

// TestAPIErrorsCarryTheReason: the API's refusal reaches the agent whole.
func TestAPIErrorsCarryTheReason(t *testing.T) {
	cs, hits := connect(t)
	res := call(t, cs, "run_command", map[string]any{"sandboxId": "nope", "cmd": "true"})
	if !res.IsError || !strings.Contains(text(res), "sandbox nope not found") {
		t.Fatalf("got error=%v %q", res.IsError, text(res))
	}
	if hits.Load() != 1 {
		t.Fatalf("%d requests, want 1", hits.Load())
	}
}

// TestToolsHaveSchemas: every tool declares its input and output, so
// clients get structured results.
func TestToolsHaveSchemas(t *testing.T) {
	cs, _ := connect(t)
	res, err := cs.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"create_sandbox", "list_sandboxes", "kill_sandbox", "pause_sandbox", "resume_sandbox", "run_command",
		"run_code", "read_file", "write_file", "list_files", "expose_port"}
	got := map[string]*mcp.Tool{}
	for _, tool := range res.Tools {
		got[tool.Name] = tool
	}
	for _, name := range want {
		tool := got[name]
		if tool == nil {
			t.Errorf("tool %s missing", name)
			continue
		}
		if tool.OutputSchema == nil || tool.Description == "" {
			t.Errorf("tool %s: output schema %v, description %q", name, tool.OutputSchema, tool.Description)
		}
	}
	b, _ := json.Marshal(got["run_command"].OutputSchema)
	for _, field := range []string{"exitCode", "stdout", "stderr"} {
		if !strings.Contains(string(b), `"`+field+`"`) {
			t.Errorf("run_command output schema lacks %s: %s", field, b)
		}
	}
}

func TestKeyFromHeader(t *testing.T) {
	for _, tc := range []struct {
		h    http.Header
		want string
	}{
		{http.Header{"X-Api-Key": {"a"}}, "a"},
		{http.Header{"Authorization": {"Bearer b"}}, "b"},
		{http.Header{"X-Api-Key": {"a"}, "Authorization": {"Bearer b"}}, "a"},
		{http.Header{"Authorization": {"Basic dTo="}}, ""},
		{http.Header{}, ""},
	} {
		if got := KeyFromHeader(tc.h); got != tc.want {
			t.Errorf("KeyFromHeader(%v) = %q, want %q", tc.h, got, tc.want)
		}
	}
}

func TestLoopbackURL(t *testing.T) {
	for _, tc := range []struct {
		addr net.Addr
		want string
	}{
		{&net.TCPAddr{IP: net.IPv4zero, Port: 3000}, "http://127.0.0.1:3000"},
		{&net.TCPAddr{IP: net.IPv6unspecified, Port: 3000}, "http://[::1]:3000"},
		{&net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 80}, "http://10.0.0.1:80"},
	} {
		if got := LoopbackURL(tc.addr); got != tc.want {
			t.Errorf("LoopbackURL(%v) = %q, want %q", tc.addr, got, tc.want)
		}
	}
}

func TestPublicURL(t *testing.T) {
	for _, tc := range []struct {
		host string
		h    http.Header
		want string
	}{
		{"agentbox.example:3000", nil, "http://agentbox.example:3000"},
		{"127.0.0.1:3000", http.Header{"X-Forwarded-Proto": {"https"}, "X-Forwarded-Host": {"ab.example"}}, "https://ab.example"},
		{"127.0.0.1:3000", http.Header{"X-Forwarded-Proto": {"javascript"}}, "http://127.0.0.1:3000"},
	} {
		r := httptest.NewRequest(http.MethodPost, "/mcp", nil)
		r.Host = tc.host
		for k, v := range tc.h {
			r.Header[k] = v
		}
		if got := publicURL(r); got != tc.want {
			t.Errorf("publicURL(Host %s, %v) = %q, want %q", tc.host, tc.h, got, tc.want)
		}
	}
}

// TestHandlerKeepsNoSession: the HTTP endpoint issues no session id, so
// nothing a caller could replay carries another caller's key; a request
// without a key gets no server even if it slipped past the API's check.
func TestHandlerKeepsNoSession(t *testing.T) {
	h := Handler(HTTPConfig{SelfURL: "http://127.0.0.1:1"})
	initialize := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`
	for _, tc := range []struct {
		key  string
		want int
	}{
		{"k", http.StatusOK},
		{"", http.StatusBadRequest},
	} {
		r := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(initialize))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Accept", "application/json, text/event-stream")
		if tc.key != "" {
			r.Header.Set("X-API-Key", tc.key)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != tc.want {
			t.Errorf("key %q: status %d, want %d: %s", tc.key, w.Code, tc.want, w.Body)
		}
		if id := w.Header().Get("Mcp-Session-Id"); id != "" {
			t.Errorf("key %q: session id %q issued", tc.key, id)
		}
	}
}

// expose_port gives the port's own origin, never a path on the API's.
func TestPortURL(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"default domain with the server's port", Config{PublicURL: "http://127.0.0.1:3000"}, "http://8000-iabc.localhost:3000/"},
		{"domain, no port", Config{PublicURL: "https://api.example.com", Domain: "sbx.example.com"}, "https://8000-iabc.sbx.example.com/"},
		{"domain with its own port (E2B_DOMAIN=localhost:3000)", Config{PublicURL: "http://127.0.0.1:3000", Domain: "localhost:3001"}, "http://8000-iabc.localhost:3001/"},
		{"the server's word wins", Config{PublicURL: "http://127.0.0.1:3000", Domain: "sbx.example.com", PortOrigin: func() (string, string) { return "https", "sbx.example.com:8443" }}, "https://8000-iabc.sbx.example.com:8443/"},
	} {
		got, err := tc.cfg.portURL("iabc", 8000)
		if err != nil || got != tc.want {
			t.Errorf("%s: %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
}

// TestJoinCapped: output is joined in one pass and cut at the limit, on a
// UTF-8 boundary; a million small chunks cost linear time.
func TestJoinCapped(t *testing.T) {
	many := make([]string, 1<<20)
	for i := range many {
		many[i] = "x"
	}
	for _, tc := range []struct {
		name   string
		chunks []string
		limit  int
		want   string
		cut    bool
	}{
		{"under the limit", []string{"ab", "cd"}, 10, "abcd", false},
		{"at the limit", []string{"ab", "cd"}, 4, "abcd", false},
		{"cut in a chunk", []string{"ab", "cdef"}, 3, "abc", true},
		{"cut before a split rune", []string{"a", "é"}, 2, "a", true},
		{"nothing", nil, 4, "", false},
		{"a million chunks", many, 1 << 10, strings.Repeat("x", 1<<10), true},
	} {
		got, cut := joinCapped(tc.chunks, tc.limit)
		if got != tc.want || cut != tc.cut {
			t.Errorf("%s: %q %v, want %q %v", tc.name, got, cut, tc.want, tc.cut)
		}
	}
}

// TestToolCallEndsWithItsRequest: a tool call whose HTTP request goes away
// stops its own calls to the API (they are made under the request's
// context), instead of running on for a client that left.
func TestToolCallEndsWithItsRequest(t *testing.T) {
	reached, ended := make(chan struct{}), make(chan struct{})
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(reached)
		<-r.Context().Done()
		close(ended)
	}))
	defer api.Close()
	srv := httptest.NewServer(Handler(HTTPConfig{SelfURL: api.URL}))
	defer srv.Close()
	ctx, cancel := context.WithCancel(t.Context())
	body := `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"list_sandboxes","arguments":{}}}`
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("X-API-Key", "k")
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	errc := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	select {
	case <-reached:
	case err := <-errc:
		t.Fatalf("the tool call ended before it reached the API: %v", err)
	}
	cancel()
	<-ended // the API saw the call go away; a leak would hang here
	<-errc
}
