package egress

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/audit"
)

func connectEvent(dst, decision string, at time.Time) audit.Event {
	return audit.Event{Time: at, SandboxID: "sb", TeamID: "team", Kind: audit.KindEgress, Action: "connect",
		Decision: decision, Reason: "rule of " + dst, Fields: map[string]any{"dst": dst, "proto": "tcp"}}
}

func TestAggregator(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	type want struct {
		dst      string // "" for a "more destinations" row
		decision string
		count    int64
		dsts     int // of a "more" row
		capped   bool
	}
	for _, tc := range []struct {
		name     string
		rate     float64 // records per second written as they are
		events   func() []audit.Event
		admitted int
		rows     []want
	}{
		{
			name: "under the rate every record is written",
			rate: 1000,
			events: func() []audit.Event {
				var out []audit.Event
				for i := range 50 {
					out = append(out, connectEvent(fmt.Sprintf("198.51.100.%d:80", i), audit.Denied, t0))
				}
				return out
			},
			admitted: 50,
		},
		{
			name: "a flood to one destination does not hide another",
			rate: 0.001,
			events: func() []audit.Event {
				var out []audit.Event
				for i := range 10000 {
					out = append(out, connectEvent("198.51.100.7:22", audit.Denied, t0.Add(time.Duration(i)*time.Millisecond)))
				}
				return append(out, connectEvent("203.0.113.9:443", audit.Allowed, t0.Add(time.Second)),
					connectEvent("198.51.100.7:22", audit.Allowed, t0.Add(time.Second)))
			},
			rows: []want{
				{dst: "198.51.100.7:22", decision: audit.Denied, count: 10000},
				{dst: "203.0.113.9:443", decision: audit.Allowed, count: 1},
				{dst: "198.51.100.7:22", decision: audit.Allowed, count: 1},
			},
		},
		{
			name: "past the bound one row per decision counts the rest",
			rate: 0.001,
			events: func() []audit.Event {
				var out []audit.Event
				for i := range aggKeys + 10 {
					out = append(out, connectEvent(fmt.Sprintf("198.51.100.%d:80", i), audit.Denied, t0))
				}
				for i := range 5 {
					out = append(out, connectEvent(fmt.Sprintf("203.0.113.%d:80", i), audit.Allowed, t0), connectEvent(fmt.Sprintf("203.0.113.%d:80", i), audit.Allowed, t0))
				}
				return out
			},
			rows: func() []want {
				var w []want
				for i := range aggKeys {
					w = append(w, want{dst: fmt.Sprintf("198.51.100.%d:80", i), decision: audit.Denied, count: 1})
				}
				return append(w, want{decision: audit.Allowed, count: 10, dsts: 5}, want{decision: audit.Denied, count: 10, dsts: 10})
			}(),
		},
		{
			name: "the distinct destinations past the bound are counted up to a cap",
			rate: 0.001,
			events: func() []audit.Event {
				var out []audit.Event
				for i := range aggKeys + aggOverflowTracked + 3 {
					out = append(out, audit.Event{Time: t0, SandboxID: "sb", Kind: audit.KindEgress, Action: "dns", Decision: audit.Denied,
						Fields: map[string]any{"dst": "dns", "host": fmt.Sprintf("q%d.exfil.test", i)}})
				}
				return out
			},
			rows: func() []want {
				var w []want
				for range aggKeys {
					w = append(w, want{dst: "dns", decision: audit.Denied, count: 1})
				}
				return append(w, want{decision: audit.Denied, count: aggOverflowTracked + 3, dsts: aggOverflowTracked, capped: true})
			}(),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newAggregator(tc.rate, 10*tc.rate)
			admitted := 0
			var total int64
			for _, ev := range tc.events() {
				total++
				if a.admit(ev) {
					admitted++
				}
			}
			if admitted != tc.admitted {
				t.Errorf("admitted %d, want %d", admitted, tc.admitted)
			}
			rows := a.drain(audit.Event{SandboxID: "sb"}, tc.rate)
			if len(rows) != len(tc.rows) {
				t.Fatalf("%d rows, want %d: %+v", len(rows), len(tc.rows), rows)
			}
			var counted int64
			for i, w := range tc.rows {
				r := rows[i]
				n, _ := r.Fields["count"].(int64)
				counted += n
				if r.Action != audit.ActionSuppressed || r.Decision != w.decision || n != w.count || r.SandboxID != "sb" || r.Kind != audit.KindEgress {
					t.Errorf("row %d = %s %s count %v, want %s count %d", i, r.Action, r.Decision, r.Fields["count"], w.decision, w.count)
				}
				if w.dst == "" {
					if r.Fields["more"] != true || r.Fields["destinations"] != w.dsts || r.Fields["destinationsCapped"] != w.capped {
						t.Errorf("row %d = %v, want %d more destinations (capped %v)", i, r.Fields, w.dsts, w.capped)
					}
					if !strings.Contains(r.Reason, w.decision) || !strings.Contains(r.Reason, "more destinations") {
						t.Errorf("row %d reason %q does not say which decision", i, r.Reason)
					}
					continue
				}
				if r.Fields["dst"] != w.dst || !strings.Contains(r.Reason, w.dst) {
					t.Errorf("row %d = %v %q, want destination %s", i, r.Fields, r.Reason, w.dst)
				}
				if r.Fields["first"] == nil || r.Fields["last"] == nil {
					t.Errorf("row %d has no first and last time: %v", i, r.Fields)
				}
			}
			if int64(admitted)+counted != total {
				t.Errorf("%d written + %d counted, want all %d", admitted, counted, total)
			}
			if again := a.drain(audit.Event{SandboxID: "sb"}, tc.rate); len(again) != 0 {
				t.Errorf("a second drain returned %d rows, want a new, empty window", len(again))
			}
		})
	}
}

func TestAggregatorTimes(t *testing.T) {
	a := newAggregator(0.001, 0.01)
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, d := range []time.Duration{3 * time.Second, time.Second, 7 * time.Second} {
		a.admit(connectEvent("198.51.100.1:80", audit.Denied, t0.Add(d)))
	}
	rows := a.drain(audit.Event{SandboxID: "sb"}, 1)
	if len(rows) != 1 {
		t.Fatalf("%d rows, want 1", len(rows))
	}
	if f, l := rows[0].Fields["first"], rows[0].Fields["last"]; f != t0.Add(time.Second).Format(time.RFC3339Nano) || l != t0.Add(7*time.Second).Format(time.RFC3339Nano) {
		t.Errorf("first %v last %v", f, l)
	}
	if rows[0].TeamID != "team" {
		t.Errorf("team %q, want the records' team", rows[0].TeamID)
	}
}
