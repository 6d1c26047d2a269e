package audit

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/store"
)

func newLogWith(t *testing.T, opts ...Option) (*Log, *store.Store) {
	t.Helper()
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "a.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return New(st, opts...), st
}

// TestFloodIsCountedNotDropped: a sandbox that sends far more events than
// its rate allows gets its burst stored and every other event counted in
// "suppressed" events; stored plus counted is exactly what it sent. A
// neighbour and the sandbox's lifecycle events are unaffected.
func TestFloodIsCountedNotDropped(t *testing.T) {
	ctx := context.Background()
	lim := Limits{Rate: 50, Burst: 100, Window: 100 * time.Millisecond}
	l, _ := newLogWith(t, WithLimits(lim))
	const sent = 20000
	start := time.Now()
	var wg sync.WaitGroup
	for w := range 4 { // concurrent senders, as the proxy and resolver are
		wg.Go(func() {
			for i := range sent / 4 {
				d := Allowed
				if i%2 == 0 {
					d = Denied
				}
				if err := l.Append(ctx, Event{SandboxID: "flood", TeamID: "t", Kind: KindProcess, Action: fmt.Sprintf("dns-%d", w), Decision: d}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := l.Append(ctx, Event{SandboxID: "flood", Kind: KindLifecycle, Action: "kill"}); err != nil {
		t.Fatal(err)
	}
	if err := l.Append(ctx, Event{SandboxID: "quiet", Kind: KindProcess, Action: "connect"}); err != nil {
		t.Fatal(err)
	}
	// The burst ends: the count is written once its window closes,
	// without Flush.
	time.Sleep(3 * lim.Window)

	evs, err := l.Query(ctx, Query{SandboxID: "flood", Kinds: []string{KindProcess}})
	if err != nil {
		t.Fatal(err)
	}
	var stored, counted, summaries int64
	decisions := map[string]int64{}
	for _, e := range evs {
		if e.Action != ActionSuppressed {
			stored++
			decisions[e.Decision]++
			continue
		}
		summaries++
		n := int64(e.Fields["count"].(float64))
		counted += n
		for d, c := range e.Fields["decisions"].(map[string]any) {
			decisions[d] += int64(c.(float64))
		}
		if !strings.Contains(e.Reason, fmt.Sprintf("%d more process events", n)) || e.TeamID != "t" {
			t.Errorf("summary %+v does not say how many or whose", e)
		}
	}
	if stored+counted != sent {
		t.Errorf("stored %d + counted %d = %d, sent %d: events went missing", stored, counted, stored+counted, sent)
	}
	if decisions[Denied] != sent/2 || decisions[Allowed] != sent/2 {
		t.Errorf("decisions %v, want %d each", decisions, sent/2)
	}
	maxStored := int64(lim.Burst) + int64(lim.Rate*elapsed.Seconds()) + 1
	if stored > maxStored {
		t.Errorf("stored %d events in %v, more than burst + rate allows (%d)", stored, elapsed, maxStored)
	}
	maxSummaries := int64(elapsed/lim.Window) + 2
	if summaries == 0 || summaries > maxSummaries {
		t.Errorf("%d summaries in %v, want 1..%d (one per window)", summaries, elapsed, maxSummaries)
	}
	for _, q := range []Query{{SandboxID: "flood", Kinds: []string{KindLifecycle}}, {SandboxID: "quiet"}} {
		if evs, err := l.Query(ctx, q); err != nil || len(evs) != 1 {
			t.Errorf("%+v: %d events (%v), want the one sent", q, len(evs), err)
		}
	}
}

// TestFloodKeepsDatabaseBounded floods the log the way a sandbox cannot
// (every event from a new sandbox id, so no rate limit applies) and checks
// that retention holds the database under its size cap.
func TestFloodKeepsDatabaseBounded(t *testing.T) {
	ctx := context.Background()
	const maxBytes = 2 << 20
	l, st := newLogWith(t, WithLimits(Limits{Rate: -1}), WithRetention(Retention{MaxBytes: maxBytes, MaxRows: 100_000}))
	fields := map[string]any{"host": strings.Repeat("x", 200)}
	for round := range 5 {
		for i := range 5000 {
			if err := l.Append(ctx, Event{SandboxID: fmt.Sprint("sb", round, "-", i), Kind: KindEgress, Action: "dns", Fields: fields}); err != nil {
				t.Fatal(err)
			}
		}
		p, err := l.Prune(ctx)
		if err != nil {
			t.Fatal(err)
		}
		used, err := st.UsedBytes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if used > maxBytes {
			t.Fatalf("round %d: database uses %d bytes after retention, cap %d", round, used, maxBytes)
		}
		if round > 0 && p.BySize == 0 {
			t.Errorf("round %d: nothing removed by size; the flood should have needed it", round)
		}
	}
	// The newest events survive; the oldest went.
	evs, err := l.Query(ctx, Query{Limit: 1})
	if err != nil || len(evs) != 1 || evs[0].SandboxID != "sb4-4999" {
		t.Fatalf("newest event %+v (%v), want sb4-4999's", evs, err)
	}
	if evs, _ := l.Query(ctx, Query{SandboxID: "sb0-0"}); len(evs) != 0 {
		t.Errorf("oldest event still there")
	}
}

func TestRetentionByAgeAndRows(t *testing.T) {
	ctx := context.Background()
	l, st := newLogWith(t, WithRetention(Retention{MaxAge: time.Hour, MaxRows: 3}))
	now := time.Now()
	for i, age := range []time.Duration{3 * time.Hour, 2 * time.Hour, 30 * time.Minute, 20 * time.Minute, 10 * time.Minute, time.Minute} {
		if err := l.Append(ctx, Event{Time: now.Add(-age), SandboxID: "a", Kind: KindLifecycle, Action: fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
	}
	p, err := l.Prune(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p.ByAge != 2 || p.ByRows != 1 {
		t.Errorf("pruned %+v, want 2 by age and 1 by rows", p)
	}
	if n, _ := st.AuditRows(ctx); n != 3 {
		t.Errorf("%d rows left, want 3", n)
	}
}

func TestPruneNow(t *testing.T) {
	ctx := context.Background()
	l, _ := newLogWith(t)
	now := time.Now()
	for _, e := range []Event{
		{Time: now.Add(-48 * time.Hour), SandboxID: "a", Kind: KindProcess, Action: "old-a"},
		{Time: now.Add(-48 * time.Hour), SandboxID: "b", Kind: KindProcess, Action: "old-b"},
		{Time: now, SandboxID: "a", Kind: KindProcess, Action: "new-a"},
		{Time: now, SandboxID: "b", Kind: KindProcess, Action: "new-b"},
	} {
		if err := l.Append(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.PruneNow(ctx, PruneRequest{}); err == nil {
		t.Error("a prune with no filter was accepted")
	}
	if n, err := l.PruneNow(ctx, PruneRequest{OlderThan: 24 * time.Hour, SandboxID: "a"}); err != nil || n != 1 {
		t.Errorf("older than a day, sandbox a: %d, %v", n, err)
	}
	if n, err := l.PruneNow(ctx, PruneRequest{SandboxID: "b"}); err != nil || n != 2 {
		t.Errorf("sandbox b: %d, %v", n, err)
	}
	evs, _ := l.Query(ctx, Query{})
	if len(evs) != 1 || evs[0].Action != "new-a" {
		t.Errorf("left %+v, want only new-a", evs)
	}
}

func TestOversizedEventIsCapped(t *testing.T) {
	ctx := context.Background()
	l, st := newLogWith(t)
	huge := strings.Repeat("é", 100_000)
	if err := l.Append(ctx, Event{SandboxID: "a", Kind: KindProcess, Action: huge, Reason: huge, Fields: map[string]any{"args": huge}}); err != nil {
		t.Fatal(err)
	}
	rows, err := st.QueryAudit(ctx, store.AuditFilter{})
	if err != nil || len(rows) != 1 {
		t.Fatal(rows, err)
	}
	r := rows[0]
	if n := len(r.Action) + len(r.Reason) + len(r.Fields); n > maxActionBytes+maxReasonBytes+maxFieldsBytes {
		t.Errorf("stored %d bytes for one event", n)
	}
	if !strings.Contains(r.Fields, `"truncated":true`) {
		t.Errorf("fields %.80s… do not say they were cut", r.Fields)
	}
}
