package sandbox

import (
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

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
