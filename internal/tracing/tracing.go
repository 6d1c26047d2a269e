// Package tracing turns on OpenTelemetry traces of the server (the sandbox
// start pipelines) when the standard OTEL_* environment asks for them, and
// exports them over OTLP/HTTP. Off by default: without the variables
// nothing is set up and the pipelines trace nothing.
package tracing

import (
	"context"
	"fmt"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Enabled says whether env (os.Getenv) asks for traces: OTEL_TRACES_EXPORTER
// "otlp", or unset with an OTLP endpoint (OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT); OTEL_SDK_DISABLED=true and
// OTEL_TRACES_EXPORTER=none turn them off.
func Enabled(env func(string) string) (bool, error) {
	if strings.EqualFold(env("OTEL_SDK_DISABLED"), "true") {
		return false, nil
	}
	switch exp := strings.TrimSpace(env("OTEL_TRACES_EXPORTER")); exp {
	case "none":
		return false, nil
	case "otlp":
		return true, nil
	case "":
		return env("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "", nil
	default:
		return false, fmt.Errorf("OTEL_TRACES_EXPORTER=%q: this server exports traces with otlp only; set otlp or none", exp)
	}
}

// Setup returns a tracer exporting to the OTLP/HTTP endpoint the OTEL_*
// variables name (the exporter reads them: endpoint, headers, timeout,
// TLS) and its shutdown, which flushes what is buffered; nil and a no-op
// shutdown when env does not ask for traces.
func Setup(ctx context.Context, env func(string) string) (trace.Tracer, func(context.Context) error, error) {
	on, err := Enabled(env)
	if err != nil || !on {
		return nil, func(context.Context) error { return nil }, err
	}
	if p := env("OTEL_EXPORTER_OTLP_PROTOCOL"); p != "" && p != "http/protobuf" {
		return nil, nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL=%q: this server speaks http/protobuf only", p)
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("OTLP trace exporter: %w", err)
	}
	// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES override the default.
	res, err := resource.Merge(resource.NewSchemaless(attribute.String("service.name", "agentbox")),
		resource.Environment())
	if err != nil {
		return nil, nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return tp.Tracer("github.com/agentbox/agentbox/internal/sandbox"), tp.Shutdown, nil
}
