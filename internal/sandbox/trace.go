package sandbox

import (
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// SetTracer traces every start pipeline with t: one span per run ("sandbox
// <path>") with a child span per step, named for the step. nil, the
// default, traces nothing at no cost. Call before serving.
func (m *Manager) SetTracer(t trace.Tracer) { m.inst.tracer = t }

// endSpan ends sp (nil: not tracing) with err's status; the run's span
// also gets what the steps resolved (sandbox, template, tier).
func endSpan(sp trace.Span, b *build, err error) {
	if sp == nil {
		return
	}
	if b != nil {
		sp.SetAttributes(attribute.String("agentbox.sandbox", b.sb.ID), attribute.String("agentbox.template", b.sb.TemplateID),
			attribute.String("agentbox.isolation", b.sb.Isolation))
	}
	if err != nil {
		sp.SetStatus(codes.Error, err.Error())
	}
	sp.End()
}
