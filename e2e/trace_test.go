package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
	"github.com/agentbox/agentbox/e2e/wire"
	"github.com/agentbox/agentbox/internal/testutil"
)

// TestCreateTraces runs a server with the standard OTEL_* variables
// pointing at a real OTLP/HTTP receiver: a create sends one "sandbox
// create" span with one child span per pipeline step, in one trace.
func TestCreateTraces(t *testing.T) {
	rcv := testutil.NewOTLPReceiver(t)
	s := harness.Start(t, harness.Name("traces"), harness.Env("OTEL_EXPORTER_OTLP_ENDPOINT="+rcv.URL, "OTEL_BSP_SCHEDULE_DELAY=100"))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := wire.New(s.URL, s.APIKey)
	sb, err := c.Create(ctx, wire.CreateRequest{TemplateID: "base", Timeout: 60})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	defer c.Kill(context.Background(), sb.SandboxID)

	steps := []string{"reserve", "resolve", "persist creating", "attach network", "start", "init envd", "wait ready", "persist running", "register"}
	var root testutil.Span
	var children map[string]testutil.Span
	for range 100 {
		spans := rcv.Spans()
		for _, sp := range spans {
			if sp.Name == "sandbox create" && sp.Attrs["agentbox.sandbox"] == sb.SandboxID {
				root = sp
			}
		}
		children = map[string]testutil.Span{}
		for _, sp := range spans {
			if root.SpanID != "" && sp.ParentID == root.SpanID {
				children[sp.Name] = sp
			}
		}
		if len(children) >= len(steps) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if root.SpanID == "" {
		t.Fatalf("no \"sandbox create\" span for %s among %+v", sb.SandboxID, rcv.Spans())
	}
	if root.Attrs["service.name"] != "agentbox" || root.Attrs["agentbox.path"] != "create" || root.Error {
		t.Errorf("create span %+v: want service agentbox, path create, no error", root)
	}
	for _, name := range steps {
		sp, ok := children[name]
		if !ok {
			t.Errorf("no %q span under the create span; children: %v", name, children)
			continue
		}
		if sp.TraceID != root.TraceID {
			t.Errorf("%q span in trace %s, not the create's %s", name, sp.TraceID, root.TraceID)
		}
	}
	if len(children) != len(steps) {
		t.Errorf("%d child spans, want one per step (%d): %v", len(children), len(steps), children)
	}
}
