package interpreter_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// keyTransport sends the API key with every request of the MCP client.
type keyTransport struct{ key string }

func (k keyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("X-API-Key", k.key)
	return http.DefaultTransport.RoundTrip(r)
}

// TestMCPRunCode runs code through the server's /mcp with the official
// MCP Go SDK client: results, streams, state and the code's errors come
// back structured.
func TestMCPRunCode(t *testing.T) {
	s := need(t)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	tr := &mcp.StreamableClientTransport{Endpoint: s.URL + "/mcp", HTTPClient: &http.Client{Transport: keyTransport{s.APIKey}}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, nil).Connect(ctx, tr, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	call := func(tool string, args map[string]any, out any) {
		t.Helper()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
		if err != nil {
			t.Fatalf("%s: %v", tool, err)
		}
		b, _ := json.Marshal(res.StructuredContent)
		if res.IsError {
			t.Fatalf("%s: tool error %+v", tool, res.Content)
		}
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s: %v: %s", tool, err, b)
		}
	}
	var sbx struct{ SandboxID string }
	call("create_sandbox", map[string]any{"template": templateName, "timeoutSeconds": 600}, &sbx)
	defer cs.CallTool(context.WithoutCancel(ctx), &mcp.CallToolParams{Name: "kill_sandbox", Arguments: map[string]any{"sandboxId": sbx.SandboxID}})

	type out struct {
		Results []struct {
			IsMainResult bool
			Text         string
			PNG          string
			Formats      []string
		}
		Stdout, Stderr string
		Error          *struct{ Name, Value string }
	}
	var o out
	call("run_code", map[string]any{"sandboxId": sbx.SandboxID, "code": "import sys\nprint('a'); print('b', file=sys.stderr)\nv = 21\nv * 2"}, &o)
	if len(o.Results) != 1 || !o.Results[0].IsMainResult || o.Results[0].Text != "42" || o.Stdout != "a\n" || o.Stderr != "b\n" || o.Error != nil {
		t.Fatalf("python: %+v", o)
	}
	o = out{}
	call("run_code", map[string]any{"sandboxId": sbx.SandboxID, "code": "v"}, &o)
	if len(o.Results) != 1 || o.Results[0].Text != "21" {
		t.Fatalf("state kept: %+v", o)
	}
	o = out{}
	call("run_code", map[string]any{"sandboxId": sbx.SandboxID, "code": "import matplotlib.pyplot as plt; plt.plot([1, 3, 2]); plt.show()"}, &o)
	if len(o.Results) != 1 || o.Results[0].PNG == "" || !strings.Contains(strings.Join(o.Results[0].Formats, ","), "png") {
		t.Fatalf("plot: %+v", o)
	}
	o = out{}
	call("run_code", map[string]any{"sandboxId": sbx.SandboxID, "code": "1/0"}, &o)
	if o.Error == nil || o.Error.Name != "ZeroDivisionError" {
		t.Fatalf("raised: %+v", o)
	}
	o = out{}
	call("run_code", map[string]any{"sandboxId": sbx.SandboxID, "code": "[1, 2].map(x => x * 3).join('-')", "language": "javascript"}, &o)
	if len(o.Results) != 1 || o.Results[0].Text != "'3-6'" && o.Results[0].Text != "3-6" {
		t.Fatalf("javascript: %+v", o)
	}
}
