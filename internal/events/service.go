package events

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"

	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/destpolicy"
	"github.com/agentbox/agentbox/internal/store"
)

// Store is what the Service keeps in the database (*store.Store).
type Store interface {
	InitEvents(ctx context.Context) error
	EventsCursor(ctx context.Context) (int64, error)
	AuditAfter(ctx context.Context, seq int64, kinds []string, limit int) ([]store.AuditRow, error)
	AppendEvents(ctx context.Context, b store.EventBatch) (int, []store.Dropped, error)
	ListEvents(ctx context.Context, f store.EventFilter) ([]string, error)
	LastEventInfo(ctx context.Context, teamID, sandboxID string) (string, bool, error)
	PruneEvents(ctx context.Context, before time.Time) (int64, error)

	ListWebhooks(ctx context.Context, teamID string) ([]store.WebhookRow, error)
	GetWebhook(ctx context.Context, teamID, id string) (store.WebhookRow, error)
	CreateWebhook(ctx context.Context, w store.WebhookRow, max int, flag string) error
	UpdateWebhook(ctx context.Context, w store.WebhookRow) error
	DeleteWebhook(ctx context.Context, teamID, id string) error
	PendingDeliveries(ctx context.Context, webhookID string) (int, error)

	DueDeliveries(ctx context.Context, now time.Time, limit int) ([]store.DeliveryRow, error)
	NextDelivery(ctx context.Context) (time.Time, bool, error)
	DeliveryDone(ctx context.Context, id string) error
	DeliveryRetry(ctx context.Context, id string, attempts int, next time.Time, lastErr string) error
	DeliveryFailed(ctx context.Context, id, webhookID, why string) error
}

// AuditFeed wakes the Service when audit rows are appended (*audit.Log).
type AuditFeed interface {
	Subscribe(sandboxID string) (<-chan audit.Event, func())
}

// Sandboxes describes the sandboxes the server holds, for the fields of an
// event (template, metadata, resources). A sandbox it no longer holds is
// described by its last event.
type Sandboxes interface {
	Info(id string) (Info, bool)
}

// Config bounds and tunes the Service. Zero fields take the defaults.
type Config struct {
	// MaxAge is how long events are kept and served (E2B keeps 7 days).
	MaxAge time.Duration
	// MaxWebhooks bounds the webhooks of one team.
	MaxWebhooks int
	// QueueMax bounds the deliveries one team is owed; past it new
	// deliveries are dropped, counted on their webhook and logged.
	QueueMax int
	// Attempts is how many times one delivery is tried before it is given up.
	Attempts int
	// RetryBase is the wait after the first failed attempt; it doubles
	// with every further failure up to RetryMax.
	RetryBase, RetryMax time.Duration
	// Timeout bounds one delivery request.
	Timeout time.Duration
	// ViolationWindow is the aggregation window of policy violations.
	ViolationWindow time.Duration
	// Workers bounds the deliveries in flight; PerTeam bounds one team's,
	// so a slow receiver of one team cannot hold every worker.
	Workers, PerTeam int
	// Flag names of the bounds, for refusals that say how to raise them.
	MaxWebhooksFlag, QueueMaxFlag string
}

// Defaults of `agentbox serve`.
const (
	DefaultMaxAge          = 7 * 24 * time.Hour
	DefaultMaxWebhooks     = 10
	DefaultQueueMax        = 1000
	DefaultAttempts        = 10
	DefaultRetryBase       = 2 * time.Second
	DefaultRetryMax        = 10 * time.Minute
	DefaultTimeout         = 10 * time.Second
	DefaultViolationWindow = 30 * time.Second
)

func (c Config) withDefaults() Config {
	set := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	seti := func(n *int, v int) {
		if *n <= 0 {
			*n = v
		}
	}
	set(&c.MaxAge, DefaultMaxAge)
	set(&c.RetryBase, DefaultRetryBase)
	set(&c.RetryMax, DefaultRetryMax)
	set(&c.Timeout, DefaultTimeout)
	set(&c.ViolationWindow, DefaultViolationWindow)
	seti(&c.MaxWebhooks, DefaultMaxWebhooks)
	seti(&c.QueueMax, DefaultQueueMax)
	seti(&c.Attempts, DefaultAttempts)
	seti(&c.Workers, 4)
	seti(&c.PerTeam, 2)
	if c.MaxWebhooksFlag == "" {
		c.MaxWebhooksFlag = "--max-webhooks"
	}
	if c.QueueMaxFlag == "" {
		c.QueueMaxFlag = "--webhook-queue-max"
	}
	return c
}

// Service derives events from the audit log, serves them and delivers
// them to webhooks.
type Service struct {
	cfg    Config
	st     Store
	feed   AuditFeed
	sbx    Sandboxes
	policy *destpolicy.Policy
	log    *slog.Logger
	now    func() time.Time

	viol *violations
	wake chan struct{} // a delivery was queued
}

// New returns a Service. policy is the server's destination policy: every
// delivery dials through it and registrations are checked against it.
func New(ctx context.Context, cfg Config, st Store, feed AuditFeed, sbx Sandboxes, policy *destpolicy.Policy, log *slog.Logger) (*Service, error) {
	if err := st.InitEvents(ctx); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if sbx == nil {
		sbx = noSandboxes{}
	}
	return &Service{cfg: cfg, st: st, feed: feed, sbx: sbx, policy: policy, log: log.With("component", "events"), now: time.Now,
		viol: newViolations(cfg.ViolationWindow, 10_000), wake: make(chan struct{}, 1)}, nil
}

// Run derives, delivers and prunes until ctx ends.
func (s *Service) Run(ctx context.Context) {
	go s.deliverLoop(ctx)
	go s.retentionLoop(ctx)
	s.deriveLoop(ctx)
}

// ---- deriving events from the audit log ----

// deriveBatch is how many audit rows one transaction turns into events.
const deriveBatch = 256

func (s *Service) deriveLoop(ctx context.Context) {
	ch, cancel := s.feed.Subscribe("")
	defer cancel()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		if err := s.Derive(ctx); err != nil && ctx.Err() == nil {
			s.log.Error("derive events from the audit log", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case _, ok := <-ch:
			if !ok {
				ch = nil
			}
		case <-tick.C:
		}
	}
}

// Derive turns the audit rows after the cursor into events, and reports
// the policy violation windows that ended.
func (s *Service) Derive(ctx context.Context) error {
	for {
		cursor, err := s.st.EventsCursor(ctx)
		if err != nil {
			return err
		}
		rows, err := s.st.AuditAfter(ctx, cursor, auditKinds, deriveBatch)
		if err != nil {
			return err
		}
		if len(rows) == 0 {
			break
		}
		var evs []store.EventRow
		infos := map[string]Info{} // this batch's newest info per sandbox
		for _, r := range rows {
			if e, ok := s.fromAudit(ctx, r, infos); ok {
				evs = append(evs, e)
			}
		}
		if err := s.append(ctx, evs, rows[len(rows)-1].Seq); err != nil {
			return err
		}
		if len(rows) < deriveBatch {
			break
		}
	}
	var evs []store.EventRow
	infos := map[string]Info{}
	for _, v := range s.viol.due(s.now()) {
		evs = append(evs, s.violationEvent(ctx, v, infos))
	}
	if len(evs) > 0 {
		return s.append(ctx, evs, 0)
	}
	return nil
}

func (s *Service) append(ctx context.Context, evs []store.EventRow, cursor int64) error {
	queued, dropped, err := s.st.AppendEvents(ctx, store.EventBatch{Events: evs, Cursor: cursor, QueueMax: s.cfg.QueueMax,
		DropReason: s.dropReason(), NewID: uuid.NewString})
	if err != nil {
		return err
	}
	for _, d := range dropped {
		s.log.Warn("webhook delivery dropped: "+s.dropReason(), "team", d.TeamID, "webhook", d.WebhookID, "event", d.EventID)
	}
	if queued > 0 {
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
	return nil
}

func (s *Service) dropReason() string {
	return fmt.Sprintf("the team's webhook queue is full (%d deliveries owed, the most this server keeps): a delivery was dropped; make the receiver answer 2xx, or ask the operator to raise %s", s.cfg.QueueMax, s.cfg.QueueMaxFlag)
}

// info describes sandbox id of team for an event: the manager's view when
// it holds the sandbox, else what its last event said.
func (s *Service) info(ctx context.Context, team, id string, batch map[string]Info) Info {
	if in, ok := batch[id]; ok {
		if live, ok := s.sbx.Info(id); ok {
			live.ExecutionID = in.ExecutionID
			return live
		}
		return in
	}
	var last Info
	if b, ok, err := s.st.LastEventInfo(ctx, team, id); err == nil && ok {
		_ = json.Unmarshal([]byte(b), &last)
	}
	if live, ok := s.sbx.Info(id); ok {
		live.ExecutionID = last.ExecutionID
		return live
	}
	return last
}

func (s *Service) fromAudit(ctx context.Context, r store.AuditRow, batch map[string]Info) (store.EventRow, bool) {
	fields := fieldsOf(r)
	if r.Kind != audit.KindLifecycle {
		rule, n := violationRule(r, fields)
		if rule == "" {
			return store.EventRow{}, false
		}
		v := s.viol.observe(s.now(), violationKey{team: r.TeamID, sandbox: r.SandboxID, rule: rule}, n, r.Time, r.Reason)
		if v == nil {
			return store.EventRow{}, false
		}
		return s.violationEvent(ctx, *v, batch), true
	}
	typ := lifecycleType(r, fields)
	if typ == "" {
		return store.EventRow{}, false
	}
	in := s.info(ctx, r.TeamID, r.SandboxID, batch)
	if in.TemplateID == "" {
		in.TemplateID, _ = fields["template"].(string)
	}
	if typ == TypeCreated || typ == TypeResumed || in.ExecutionID == "" {
		in.ExecutionID = uuid.NewString()
	}
	data := map[string]any{}
	switch typ {
	case TypeKilled, TypePaused:
		if !in.StartedAt.IsZero() {
			data["execution"] = map[string]any{
				"started_at":     in.StartedAt.UTC().Format(time.RFC3339),
				"vcpu_count":     in.CPUCount,
				"memory_mb":      in.MemoryMB,
				"execution_time": r.Time.Sub(in.StartedAt).Milliseconds(),
			}
		}
		if typ == TypeKilled {
			data["kill_reason"] = killReason(r.Reason)
		}
	case TypeUpdated:
		if end, ok := fields["end_at"].(string); ok {
			data["set_timeout"] = end
		}
		if n, ok := fields["network_egress"].(map[string]any); ok {
			data["network_egress"] = n
		}
	}
	batch[r.SandboxID] = in
	return s.event(typ, r.TeamID, r.SandboxID, r.Time, in, data), true
}

func (s *Service) violationEvent(ctx context.Context, v violation, batch map[string]Info) store.EventRow {
	in := s.info(ctx, v.key.team, v.key.sandbox, batch)
	batch[v.key.sandbox] = in
	return s.event(TypePolicyViolation, v.key.team, v.key.sandbox, v.last, in, v.data())
}

func (s *Service) event(typ, team, sandboxID string, at time.Time, in Info, data map[string]any) store.EventRow {
	if len(in.Metadata) > 0 {
		data["sandbox_metadata"] = in.Metadata
	}
	if len(data) == 0 {
		data = nil // E2B sends null
	}
	build := in.BuildID
	if build == "" {
		build = in.TemplateID
	}
	e := Event{Version: Version, ID: uuid.NewString(), Type: typ, EventData: data, SandboxBuildID: build,
		SandboxExecutionID: in.ExecutionID, SandboxID: sandboxID, SandboxTeamID: team, SandboxTemplateID: in.TemplateID,
		Timestamp: at.UTC()}
	body, _ := json.Marshal(e)
	info, _ := json.Marshal(in)
	return store.EventRow{ID: e.ID, TeamID: team, SandboxID: sandboxID, Type: typ, Time: e.Timestamp, Body: string(body), Info: string(info)}
}

// ---- retention ----

func (s *Service) retentionLoop(ctx context.Context) {
	tick := time.NewTicker(min(time.Hour, s.cfg.MaxAge/4+time.Second))
	defer tick.Stop()
	for {
		if n, err := s.st.PruneEvents(ctx, s.now().Add(-s.cfg.MaxAge)); err != nil && ctx.Err() == nil {
			s.log.Error("prune events", "err", err)
		} else if n > 0 {
			s.log.Info("pruned events past their age", "events", n, "max-age", s.cfg.MaxAge)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

type noSandboxes struct{}

func (noSandboxes) Info(string) (Info, bool) { return Info{}, false }
