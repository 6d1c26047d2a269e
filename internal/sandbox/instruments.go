package sandbox

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/crashpoint"
)

// instruments is what watches every operation of the manager and its
// parts: the audit log, the observer, the tracer, the tests' step hook and
// the crash point. One is shared by all of them; it is set at New (Options)
// and only read after.
type instruments struct {
	log    *slog.Logger
	audit  *audit.Log   // nil: no audit log
	obs    Observer     // never nil
	tracer trace.Tracer // nil: not traced
	// stepHook, when set (tests), runs after each pipeline or pause step
	// succeeds; an error fails the operation there, as if the step had.
	stepHook func(path, step string) error
	// faultStep is the crash point ("<operation>/<step>", crash.go).
	faultStep string
}

func newInstruments(log *slog.Logger) *instruments {
	return &instruments{log: log, obs: noObserver{}}
}

// auditLifecycle records a lifecycle event of sb.
func (i *instruments) auditLifecycle(ctx context.Context, sb *Sandbox, action, decision, reason string, fields map[string]any) {
	if i.audit == nil {
		return
	}
	if fields == nil {
		fields = map[string]any{}
	}
	fields["template"] = sb.TemplateID
	if sb.BuildID != "" {
		fields["build"] = sb.BuildID
	}
	if sb.Isolation != "" {
		fields["isolation"] = sb.Isolation
	}
	i.audit.Record(ctx, audit.Event{SandboxID: sb.ID, TeamID: sb.TeamID, APIKeyID: sb.APIKeyID, Kind: audit.KindLifecycle,
		Action: action, Decision: decision, Reason: reason, Fields: fields})
}

// record appends ev to the audit log, if there is one.
func (i *instruments) record(ctx context.Context, ev audit.Event) {
	if i.audit != nil {
		i.audit.Record(ctx, ev)
	}
}

// observe records one lifecycle call that started at start; deferred with
// the call's named error.
func (i *instruments) observe(op string, start time.Time, err *error) {
	i.obs.Lifecycle(op, *err == nil, time.Since(start))
}

// traceRun opens the span of one pipeline run; nil without a tracer.
func (i *instruments) traceRun(ctx context.Context, b *build) (context.Context, trace.Span) {
	if i.tracer == nil {
		return ctx, nil
	}
	return i.tracer.Start(ctx, "sandbox "+b.path, trace.WithAttributes(
		attribute.String("agentbox.path", b.path), attribute.String("agentbox.team", b.sb.TeamID)))
}

// traceStep opens the span of one step under the run's.
func (i *instruments) traceStep(ctx context.Context, step string) (context.Context, trace.Span) {
	if i.tracer == nil {
		return ctx, nil
	}
	return i.tracer.Start(ctx, step)
}

// stepDone runs the step hook after a step of path succeeded.
func (i *instruments) stepDone(path, step string) error {
	if i.stepHook == nil {
		return nil
	}
	return i.stepHook(path, step)
}

// crashAfter kills the server when op/step is the configured crash point.
func (i *instruments) crashAfter(op, step string) {
	crashpoint.New(i.faultStep, i.log).After(op, step)
}

// fault is crashAfter for a point named "<operation>:<step>".
func (i *instruments) fault(step string) {
	op, name, _ := strings.Cut(step, ":")
	i.crashAfter(op, name)
}
