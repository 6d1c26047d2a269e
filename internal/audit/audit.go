// Package audit is agentbox's append-only audit log: every lifecycle change,
// process start and end, file change through the API, egress decision and
// limit hit of a sandbox, stored durably in the server's SQLite database and
// delivered live to followers.
//
// The log is bounded and honest: each sandbox may add events of one kind at
// a limited rate (limit.go), and what it sends beyond that is counted and
// written as one "suppressed" event per kind and window instead of being
// dropped silently; retention (retention.go) removes rows past an age, a
// row count and a database size.
package audit

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/store"
)

// Kinds of events.
const (
	KindLifecycle = "lifecycle"
	KindProcess   = "process"
	KindFile      = "file"
	KindEgress    = "egress"
	KindLimit     = "limit"
	KindSyscall   = "syscall" // a syscall the sandbox's seccomp policy refused
	KindIngress   = "ingress" // traffic into a sandbox that bypasses the data plane's HTTP routing (port-forward tunnels)
)

// Decisions.
const (
	Allowed = "allowed"
	Denied  = "denied"
	Info    = "info"
)

// ValidKind reports whether k is a known event kind.
func ValidKind(k string) bool {
	switch k {
	case KindLifecycle, KindProcess, KindFile, KindEgress, KindLimit, KindSyscall, KindIngress:
		return true
	}
	return false
}

// Event is one audit record.
type Event struct {
	Seq       int64          `json:"seq"` // assigned by Append; increases with every event
	Time      time.Time      `json:"time"`
	SandboxID string         `json:"sandboxID"`
	TeamID    string         `json:"teamID"`
	APIKeyID  string         `json:"apiKeyID,omitempty"`
	Kind      string         `json:"kind"`
	Action    string         `json:"action"`             // e.g. "create", "start", "exit", "write", "oom"
	Decision  string         `json:"decision,omitempty"` // allowed, denied or info
	Reason    string         `json:"reason,omitempty"`   // why, in words an agent can act on
	Fields    map[string]any `json:"fields,omitempty"`
}

// Query selects events; zero fields match everything.
type Query struct {
	SandboxID string
	TeamID    string
	Kinds     []string
	Since     time.Time
	AfterSeq  int64 // only events appended after this one (cursor for follow)
	Limit     int   // the newest Limit events; 0 = all
}

// Log is the audit log of one server. Safe for concurrent use.
type Log struct {
	st        *store.Store
	initErr   error
	log       *slog.Logger
	limits    Limits
	retention Retention

	mu   sync.Mutex
	subs map[string]map[*subscriber]bool // sandbox id ("" = all) → followers

	lim     limiter       // per sandbox and kind rate limit (limit.go)
	kick    chan struct{} // wakes retention early when many rows came in
	appends atomic.Int64  // rows appended since retention last ran
}

type subscriber struct {
	ch chan Event
}

// subBuffer is how many events a slow follower may lag before it misses
// some; the durable log still has them.
const subBuffer = 256

// Option configures a Log.
type Option func(*Log)

// WithLimits sets the per-sandbox rate limit; unset fields take the
// defaults (DefaultRate, DefaultBurst, DefaultWindow).
func WithLimits(lim Limits) Option { return func(l *Log) { l.limits = lim } }

// WithRetention sets what RunRetention and Prune remove; without it the log
// keeps DefaultMaxAge, DefaultMaxRows and DefaultMaxBytes.
func WithRetention(r Retention) Option { return func(l *Log) { l.retention = r } }

// WithLogger sets where the log reports its own failures.
func WithLogger(log *slog.Logger) Option {
	return func(l *Log) { l.log = log.With("component", "audit") }
}

// New returns the audit log kept in st, creating its table if needed.
func New(st *store.Store, opts ...Option) *Log {
	l := &Log{
		st: st, initErr: st.InitAudit(context.Background()), log: slog.Default().With("component", "audit"),
		retention: Retention{MaxAge: DefaultMaxAge, MaxRows: DefaultMaxRows, MaxBytes: DefaultMaxBytes},
		subs:      map[string]map[*subscriber]bool{},
		kick:      make(chan struct{}, 1),
	}
	for _, o := range opts {
		o(l)
	}
	l.limits = l.limits.withDefaults()
	l.lim.buckets = map[bucketKey]*bucket{}
	return l
}

// Size caps of one stored event: what a sandbox chooses (command lines,
// paths, host names) cannot make a row large.
const (
	maxActionBytes = 64
	maxReasonBytes = 1024
	maxFieldsBytes = 8192
)

// Append stores e (setting Time if zero and Seq) and hands it to followers.
// An event over its sandbox's rate limit is not stored but counted, and the
// count is written as a "suppressed" event (see Limits); Append returns nil
// for it.
func (l *Log) Append(ctx context.Context, e Event) error {
	if l.initErr != nil {
		return l.initErr
	}
	if !ValidKind(e.Kind) {
		return fmt.Errorf("audit: kind %q: %w", e.Kind, errdefs.ErrInvalidArgument)
	}
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	e.Time = e.Time.UTC()
	if e.Decision == "" {
		e.Decision = Info
	}
	if !l.admit(e) {
		return nil
	}
	return l.store(ctx, e)
}

// store writes e without asking the rate limiter.
func (l *Log) store(ctx context.Context, e Event) error {
	fields := "{}"
	if len(e.Fields) > 0 {
		b, err := json.Marshal(e.Fields)
		if err != nil {
			return fmt.Errorf("audit: fields: %w", err)
		}
		fields = string(b)
	}
	if len(fields) > maxFieldsBytes {
		e.Fields = map[string]any{"truncated": true, "bytes": len(fields), "prefix": truncate(fields, maxFieldsBytes/2)}
		b, _ := json.Marshal(e.Fields)
		fields = string(b)
	}
	e.Action, e.Reason = truncate(e.Action, maxActionBytes), truncate(e.Reason, maxReasonBytes)
	// An audit record must not be lost because the request that caused it
	// was cancelled a moment later.
	seq, err := l.st.AppendAudit(context.WithoutCancel(ctx), store.AuditRow{
		Time: e.Time, SandboxID: e.SandboxID, TeamID: e.TeamID, APIKeyID: e.APIKeyID,
		Kind: e.Kind, Action: e.Action, Decision: e.Decision, Reason: e.Reason, Fields: fields,
	})
	if err != nil {
		return err
	}
	e.Seq = seq
	if l.appends.Add(1) >= l.retention.kickEvery() {
		select {
		case l.kick <- struct{}{}:
		default:
		}
	}
	l.publish(e)
	return nil
}

// truncate cuts s to at most n bytes on a UTF-8 boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n-len("…")], "") + "…"
}

// Record appends e and logs (instead of returning) a failure: for callers
// whose own work must not fail because auditing did.
func (l *Log) Record(ctx context.Context, e Event) {
	if err := l.Append(ctx, e); err != nil {
		l.log.Error("audit append failed", "sandbox", e.SandboxID, "kind", e.Kind, "action", e.Action, "err", err)
	}
}

func (l *Log) publish(e Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, key := range []string{e.SandboxID, ""} {
		for s := range l.subs[key] {
			select {
			case s.ch <- e:
			default: // never block the writer on a slow follower
			}
		}
		if e.SandboxID == "" {
			break
		}
	}
}

// Query returns matching events in the order they were appended.
func (l *Log) Query(ctx context.Context, q Query) ([]Event, error) {
	if l.initErr != nil {
		return nil, l.initErr
	}
	for _, k := range q.Kinds {
		if !ValidKind(k) {
			return nil, fmt.Errorf("kind %q is not an audit event kind (lifecycle, process, file, egress, limit, syscall): %w", k, errdefs.ErrInvalidArgument)
		}
	}
	rows, err := l.st.QueryAudit(ctx, store.AuditFilter{
		SandboxID: q.SandboxID, TeamID: q.TeamID, Kinds: q.Kinds, Since: q.Since, AfterSeq: q.AfterSeq, Limit: q.Limit,
	})
	if err != nil {
		return nil, err
	}
	out := make([]Event, 0, len(rows))
	for _, r := range rows {
		e := Event{Seq: r.Seq, Time: r.Time.UTC(), SandboxID: r.SandboxID, TeamID: r.TeamID, APIKeyID: r.APIKeyID,
			Kind: r.Kind, Action: r.Action, Decision: r.Decision, Reason: r.Reason}
		if r.Fields != "" && r.Fields != "{}" {
			if err := json.Unmarshal([]byte(r.Fields), &e.Fields); err != nil {
				return nil, fmt.Errorf("audit event %d: fields: %w", r.Seq, err)
			}
		}
		out = append(out, e)
	}
	return out, nil
}

// Subscribe delivers every event of sandboxID ("" = every sandbox) appended
// from now on, until cancel is called. A follower that falls more than a
// few hundred events behind misses events; it can catch up with Query and
// the last Seq it saw.
func (l *Log) Subscribe(sandboxID string) (<-chan Event, func()) {
	s := &subscriber{ch: make(chan Event, subBuffer)}
	l.mu.Lock()
	if l.subs[sandboxID] == nil {
		l.subs[sandboxID] = map[*subscriber]bool{}
	}
	l.subs[sandboxID][s] = true
	l.mu.Unlock()
	var once sync.Once
	return s.ch, func() {
		once.Do(func() {
			l.mu.Lock()
			delete(l.subs[sandboxID], s)
			if len(l.subs[sandboxID]) == 0 {
				delete(l.subs, sandboxID)
			}
			l.mu.Unlock()
			close(s.ch)
		})
	}
}
