package audit

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"time"
)

// Limits bound how fast one sandbox adds events of one kind. Lifecycle
// events are never limited: the API calls that cause them are.
type Limits struct {
	// Rate is how many events per second a sandbox may add of one kind
	// once its burst is spent. Negative: no limit.
	Rate float64
	// Burst is how many events of one kind a sandbox may add at once.
	Burst int
	// Window is how long suppressed events are counted before the count is
	// written as one "suppressed" event: at most one such event per
	// sandbox, kind and window, also while a flood goes on.
	Window time.Duration
}

// The default limits: a busy agent's commands, files and lookups fit; a
// flood costs at most about 20 rows a second per sandbox and kind.
const (
	DefaultRate   = 20
	DefaultBurst  = 200
	DefaultWindow = time.Second
)

// withDefaults fills unset fields with the defaults above.
func (l Limits) withDefaults() Limits {
	if l.Rate == 0 {
		l.Rate = DefaultRate
	}
	if l.Burst <= 0 {
		l.Burst = DefaultBurst
	}
	if l.Window <= 0 {
		l.Window = DefaultWindow
	}
	return l
}

// ActionSuppressed is the action of the event that counts what a sandbox
// sent over its rate limit.
const ActionSuppressed = "suppressed"

type bucketKey struct{ sandboxID, kind string }

// bucket is a token bucket plus the tally of what it refused since the
// last summary.
type bucket struct {
	tokens float64
	last   time.Time

	suppressed  int64
	first, end  time.Time // of the suppressed events
	teamID, key string
	decisions   map[string]int64
	actions     map[string]int64
	timer       *time.Timer
}

// maxTalliedActions bounds the per-action counts of one summary.
const maxTalliedActions = 16

type limiter struct {
	mu        sync.Mutex
	buckets   map[bucketKey]*bucket
	lastSweep time.Time
}

// admit takes a token for e, or counts e as suppressed and makes sure a
// summary will be written.
func (l *Log) admit(e Event) bool {
	// A summary of another limiter (the egress proxy counts its own floods)
	// is already at most one per its window; dropping it would lose counts.
	//
	// Egress events come from the egress proxy alone, which applies the
	// same rate and aggregates what is over it per destination and
	// decision: counted again here, the destinations it kept apart would
	// fold into one number.
	if e.Kind == KindLifecycle || e.Kind == KindEgress || e.Action == ActionSuppressed || l.limits.Rate < 0 {
		return true
	}
	lim := &l.lim
	now := time.Now()
	lim.mu.Lock()
	defer lim.mu.Unlock()
	l.sweep(now)
	k := bucketKey{e.SandboxID, e.Kind}
	b := lim.buckets[k]
	if b == nil {
		b = &bucket{tokens: float64(l.limits.Burst), last: now}
		lim.buckets[k] = b
	}
	b.tokens = min(float64(l.limits.Burst), b.tokens+now.Sub(b.last).Seconds()*l.limits.Rate)
	b.last = now
	if b.tokens >= 1 {
		b.tokens--
		return true
	}
	if b.suppressed == 0 {
		b.first, b.decisions, b.actions = e.Time, map[string]int64{}, map[string]int64{}
		b.timer = time.AfterFunc(l.limits.Window, func() { l.flushBucket(k) })
	}
	b.suppressed++
	b.end, b.teamID, b.key = e.Time, e.TeamID, e.APIKeyID
	b.decisions[e.Decision]++
	if _, ok := b.actions[e.Action]; ok || len(b.actions) < maxTalliedActions {
		b.actions[e.Action]++
	}
	return false
}

// sweep forgets buckets that are full again and owe no summary, so the
// map does not grow with every sandbox ever seen. Called with lim.mu held.
func (l *Log) sweep(now time.Time) {
	lim := &l.lim
	if now.Sub(lim.lastSweep) < time.Minute {
		return
	}
	lim.lastSweep = now
	for k, b := range lim.buckets {
		full := b.tokens+now.Sub(b.last).Seconds()*l.limits.Rate >= float64(l.limits.Burst)
		if full && b.suppressed == 0 {
			delete(lim.buckets, k)
		}
	}
}

// flushBucket writes the summary of what bucket k suppressed.
func (l *Log) flushBucket(k bucketKey) {
	l.lim.mu.Lock()
	b := l.lim.buckets[k]
	if b == nil || b.suppressed == 0 {
		l.lim.mu.Unlock()
		return
	}
	e := l.summary(k, b)
	b.suppressed, b.timer = 0, nil
	l.lim.mu.Unlock()
	if err := l.store(context.Background(), e); err != nil {
		l.log.Error("audit: writing the count of suppressed events failed", "sandbox", k.sandboxID, "kind", k.kind, "count", e.Fields["count"], "err", err)
	}
}

// summary is the event that stands for b's suppressed events. Called with
// lim.mu held.
func (l *Log) summary(k bucketKey, b *bucket) Event {
	return Event{
		Time: time.Now().UTC(), SandboxID: k.sandboxID, TeamID: b.teamID, APIKeyID: b.key,
		Kind: k.kind, Action: ActionSuppressed, Decision: Info,
		Reason: fmt.Sprintf("%d more %s events of this sandbox were not recorded: it sent more than %g a second (burst %d)",
			b.suppressed, k.kind, l.limits.Rate, l.limits.Burst),
		Fields: map[string]any{
			"count": b.suppressed, "first": b.first.UTC().Format(time.RFC3339Nano), "last": b.end.UTC().Format(time.RFC3339Nano),
			"decisions": maps.Clone(b.decisions), "actions": maps.Clone(b.actions),
		},
	}
}

// Flush writes the summaries of every count of suppressed events now,
// without waiting for their windows to end (at shutdown, and in tests).
func (l *Log) Flush(ctx context.Context) error {
	l.lim.mu.Lock()
	var pending []Event
	for k, b := range l.lim.buckets {
		if b.suppressed == 0 {
			continue
		}
		if b.timer != nil {
			b.timer.Stop()
		}
		pending = append(pending, l.summary(k, b))
		b.suppressed, b.timer = 0, nil
	}
	l.lim.mu.Unlock()
	var firstErr error
	for _, e := range pending {
		if err := l.store(ctx, e); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	return firstErr
}
