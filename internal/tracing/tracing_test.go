package tracing

import (
	"context"
	"testing"

	"github.com/agentbox/agentbox/internal/testutil"
)

func TestEnabled(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     map[string]string
		on, err bool
	}{
		{name: "nothing set: off"},
		{name: "endpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, on: true},
		{name: "traces endpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, on: true},
		{name: "otlp exporter, default endpoint", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, on: true},
		{name: "exporter none wins", env: map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}},
		{name: "sdk disabled wins", env: map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}},
		{name: "unsupported exporter", env: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			on, err := Enabled(func(k string) string { return tc.env[k] })
			if on != tc.on || (err != nil) != tc.err {
				t.Errorf("Enabled = %v, %v; want %v, error %v", on, err, tc.on, tc.err)
			}
		})
	}
}

func TestSetupOffIsNil(t *testing.T) {
	tr, stop, err := Setup(context.Background(), func(string) string { return "" })
	if err != nil || tr != nil {
		t.Fatalf("Setup with no OTEL_*: %v, %v; want no tracer", tr, err)
	}
	if err := stop(context.Background()); err != nil {
		t.Error(err)
	}
}

// Spans reach a real OTLP/HTTP receiver at the endpoint the environment
// names, with the parent links and the service name.
func TestSetupExports(t *testing.T) {
	rcv := testutil.NewOTLPReceiver(t)
	env := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": rcv.URL, "OTEL_SERVICE_NAME": "agentbox-test"}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.URL) // the exporter reads the process environment
	t.Setenv("OTEL_SERVICE_NAME", "agentbox-test")
	ctx := context.Background()
	tr, stop, err := Setup(ctx, func(k string) string { return env[k] })
	if err != nil || tr == nil {
		t.Fatalf("Setup: %v", err)
	}
	cctx, parent := tr.Start(ctx, "sandbox create")
	_, child := tr.Start(cctx, "reserve")
	child.End()
	parent.End()
	if err := stop(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	spans := rcv.Spans()
	if len(spans) != 2 {
		t.Fatalf("received %+v, want 2 spans", spans)
	}
	byName := map[string]testutil.Span{}
	for _, s := range spans {
		byName[s.Name] = s
	}
	p, c := byName["sandbox create"], byName["reserve"]
	if p.SpanID == "" || c.ParentID != p.SpanID || c.TraceID != p.TraceID {
		t.Errorf("reserve is not a child of sandbox create: %+v %+v", p, c)
	}
	if p.Attrs["service.name"] != "agentbox-test" {
		t.Errorf("service.name %q, want OTEL_SERVICE_NAME's", p.Attrs["service.name"])
	}
}
