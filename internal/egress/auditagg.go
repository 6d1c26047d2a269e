package egress

import (
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/agentbox/agentbox/internal/audit"
)

// A sandbox's egress records are written one by one within its audit rate
// (Limits.AuditRate). Past it they are not dropped into one count: each
// (destination, action, decision) gets a row of its own with the count and
// the first and last time, written every aggregation window, so a flood
// to one destination cannot hide the single connection to another. The
// rows per sandbox and window are bounded (aggKeys); destinations past the
// bound are counted in one "more destinations" row per decision.

// aggKeys bounds the destinations one sandbox's window holds rows for.
const aggKeys = 32

// aggOverflowTracked bounds the distinct destinations counted past aggKeys;
// beyond it the row says "at least".
const aggOverflowTracked = 1024

// aggKey is what a row of the aggregate stands for.
type aggKey struct {
	action   string // connect, request, dns
	dst      string // address:port, or "dns"
	host     string // SNI, Host or queried name, when there is one
	decision string
}

func (k aggKey) String() string {
	s := k.dst
	if k.host != "" {
		s = k.host + " (" + k.dst + ")"
	}
	return s
}

// aggRow is one destination's records past the rate in this window.
type aggRow struct {
	count       int64
	first, last time.Time
	reason      string
	proto       string
}

// aggMore counts the records of one decision past the aggKeys bound.
type aggMore struct {
	count       int64
	first, last time.Time
	dsts        map[aggKey]struct{}
	capped      bool
}

// aggregator is one sandbox's audit rate and what it held back.
type aggregator struct {
	rate *bucket

	mu             sync.Mutex
	rows           map[aggKey]*aggRow
	order          []aggKey // first seen first
	more           map[string]*aggMore
	teamID, apiKey string
}

func newAggregator(rate, burst float64) *aggregator {
	return &aggregator{rate: newBucket(rate, burst), rows: map[aggKey]*aggRow{}, more: map[string]*aggMore{}}
}

func keyOf(ev audit.Event) aggKey {
	k := aggKey{action: ev.Action, decision: ev.Decision}
	if s, ok := ev.Fields["dst"].(string); ok {
		k.dst = s
	}
	if s, ok := ev.Fields["host"].(string); ok {
		k.host = s
	}
	return k
}

// admit reports whether ev may be written as it is; when not, it is
// counted in its destination's row (or the decision's "more" row).
func (a *aggregator) admit(ev audit.Event) bool {
	if a.rate.allow() {
		return true
	}
	at := ev.Time
	if at.IsZero() {
		at = time.Now()
	}
	k := keyOf(ev)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.teamID, a.apiKey = ev.TeamID, ev.APIKeyID
	if r := a.rows[k]; r != nil {
		r.count++
		r.first, r.last = minTime(r.first, at), maxTime(r.last, at)
		return false
	}
	if len(a.rows) < aggKeys {
		proto, _ := ev.Fields["proto"].(string)
		a.rows[k] = &aggRow{count: 1, first: at, last: at, reason: ev.Reason, proto: proto}
		a.order = append(a.order, k)
		return false
	}
	m := a.more[k.decision]
	if m == nil {
		m = &aggMore{first: at, last: at, dsts: map[aggKey]struct{}{}}
		a.more[k.decision] = m
	}
	m.count++
	m.first, m.last = minTime(m.first, at), maxTime(m.last, at)
	if _, seen := m.dsts[k]; !seen {
		if len(m.dsts) < aggOverflowTracked {
			m.dsts[k] = struct{}{}
		} else {
			m.capped = true
		}
	}
	return false
}

// drain returns the rows held back since the last drain and starts a new
// window. like labels them when no record of this window did.
func (a *aggregator) drain(like audit.Event, limit float64) []audit.Event {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.order) == 0 && len(a.more) == 0 {
		return nil
	}
	team, key := a.teamID, a.apiKey
	if team == "" {
		team, key = like.TeamID, like.APIKeyID
	}
	base := func(at time.Time, decision, reason string, fields map[string]any) audit.Event {
		return audit.Event{Time: at, SandboxID: like.SandboxID, TeamID: team, APIKeyID: key,
			Kind: audit.KindEgress, Action: audit.ActionSuppressed, Decision: decision, Reason: reason, Fields: fields}
	}
	var out []audit.Event
	for _, k := range a.order {
		r := a.rows[k]
		fields := map[string]any{
			"dst": k.dst, "recordAction": k.action, "count": r.count,
			"first": r.first.UTC().Format(time.RFC3339Nano), "last": r.last.UTC().Format(time.RFC3339Nano),
		}
		if k.host != "" {
			fields["host"] = k.host
		}
		if r.proto != "" {
			fields["proto"] = r.proto
		}
		out = append(out, base(r.first, k.decision,
			fmt.Sprintf("%d more %s %s to %s over the audit rate of %.0f per second (%s)", r.count, k.action, k.decision, k, limit, r.reason), fields))
	}
	decisions := make([]string, 0, len(a.more))
	for d := range a.more {
		decisions = append(decisions, d)
	}
	sort.Strings(decisions)
	for _, d := range decisions {
		m := a.more[d]
		n := fmt.Sprint(len(m.dsts))
		if m.capped {
			n = "at least " + n
		}
		out = append(out, base(m.first, d,
			fmt.Sprintf("%d more %s records to %s more destinations over the audit rate of %.0f per second", m.count, d, n, limit),
			map[string]any{"count": m.count, "destinations": len(m.dsts), "destinationsCapped": m.capped, "more": true,
				"first": m.first.UTC().Format(time.RFC3339Nano), "last": m.last.UTC().Format(time.RFC3339Nano)}))
	}
	a.rows, a.order, a.more = map[aggKey]*aggRow{}, nil, map[string]*aggMore{}
	a.teamID, a.apiKey = "", ""
	return out
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
