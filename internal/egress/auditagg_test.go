package egress

import (
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/audit"
)

func connectEvent(dst, decision string, at time.Time) audit.Event {
	return audit.Event{Time: at, SandboxID: "sb", TeamID: "team", Kind: audit.KindEgress, Action: "connect",
		Decision: decision, Reason: "rule of " + dst, Fields: map[string]any{"dst": dst, "proto": "tcp"}}
}

func dnsEvent(name, decision string, at time.Time) audit.Event {
	return audit.Event{Time: at, SandboxID: "sb", TeamID: "team", Kind: audit.KindEgress, Action: "dns",
		Decision: decision, Reason: "not in allowOut", Fields: map[string]any{"dst": "dns", "host": name}}
}

// names reports whether row r names the destination dst (address:port) or
// host of a record with decision: its own row, its address's row, or a
// prefix or domain row that lists it among its members.
func names(r audit.Event, decision, dst, host string) (exact, named bool) {
	if r.Decision != decision {
		return false, false
	}
	members, _ := r.Fields["members"].([]string)
	switch {
	case host != "" && r.Fields["fold"] == foldExact && r.Fields["host"] == host:
		return true, true
	case host == "" && r.Fields["fold"] == foldExact && r.Fields["dst"] == dst:
		return true, true
	case host != "" && slices.Contains(members, host), host == "" && slices.Contains(members, dst):
		return false, true
	}
	return false, false
}

// within reports whether row r stands for destinations inside prefix p only.
func within(r audit.Event, p netip.Prefix) bool {
	if s, ok := r.Fields["prefix"].(string); ok {
		rp, err := netip.ParsePrefix(s)
		return err == nil && p.Bits() <= rp.Bits() && p.Contains(rp.Addr())
	}
	s, _ := r.Fields["dst"].(string)
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return p.Contains(ap.Addr())
	}
	a, err := netip.ParseAddr(s)
	return err == nil && p.Contains(a)
}

// familyRows bounds one family's rows in a window, its family row aside.
const familyRows = aggTopRows + 4*aggLevelRows

func TestAggregator(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Microsecond) }
	type needle struct {
		dst, host, decision string
		exact               bool // must keep a row of its own, not only be listed in a folded one
	}
	for _, tc := range []struct {
		name     string
		rate     float64 // records per second written as they are
		events   func() []audit.Event
		admitted int
		needles  []needle
		// flood, when set, must be counted whole in rows of decision
		// denied that stand for destinations inside it alone.
		flood      netip.Prefix
		floodCount int64
		maxRows    int
		check      func(t *testing.T, rows []audit.Event)
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
					out = append(out, connectEvent("198.51.100.7:22", audit.Denied, at(i)))
				}
				return append(out, connectEvent("203.0.113.9:443", audit.Allowed, t0.Add(time.Second)),
					connectEvent("198.51.100.7:22", audit.Allowed, t0.Add(time.Second)))
			},
			needles: []needle{{dst: "203.0.113.9:443", decision: audit.Allowed, exact: true},
				{dst: "198.51.100.7:22", decision: audit.Allowed, exact: true}},
			flood: netip.MustParsePrefix("198.51.100.7/32"), floodCount: 10000,
			maxRows: 3,
		},
		{
			name: "a port sweep of one address does not hide a connection to another",
			rate: 0.001,
			events: func() []audit.Event {
				var out []audit.Event
				for i := range 2000 {
					if i == 1000 {
						out = append(out, connectEvent("203.0.113.9:443", audit.Denied, at(i)))
					}
					out = append(out, connectEvent(fmt.Sprintf("198.18.6.10:%d", i+1), audit.Denied, at(i)))
				}
				return out
			},
			needles: []needle{{dst: "203.0.113.9:443", decision: audit.Denied, exact: true}},
			flood:   netip.MustParsePrefix("198.18.6.10/32"), floodCount: 2000,
			maxRows: aggChildren + 2,
			check: func(t *testing.T, rows []audit.Event) {
				for _, r := range rows {
					if r.Fields["fold"] != foldAddress {
						continue
					}
					if r.Fields["dst"] != "198.18.6.10" || r.Fields["distinct"] != 2000-aggChildren || r.Fields["portRange"] != fmt.Sprintf("%d-2000", aggChildren+1) ||
						len(r.Fields["ports"].([]int)) == 0 || !strings.Contains(r.Reason, "198.18.6.10 ports") {
						t.Errorf("the sweep's address row = %v %q, want 198.18.6.10 with %d distinct ports %d-2000", r.Fields, r.Reason, 2000-aggChildren, aggChildren+1)
					}
					return
				}
				t.Errorf("no row folds the ports of 198.18.6.10: %v", rows)
			},
		},
		{
			name: "a sweep of a /16 does not hide a connection outside it",
			rate: 0.001,
			events: func() []audit.Event {
				var out []audit.Event
				for i := range 1 << 16 {
					if i == 40000 {
						out = append(out, connectEvent("198.18.0.7:22", audit.Denied, at(i)))
					}
					out = append(out, connectEvent(fmt.Sprintf("10.0.%d.%d:80", i>>8, i&0xff), audit.Denied, at(i)))
				}
				return out
			},
			needles: []needle{{dst: "198.18.0.7:22", decision: audit.Denied, exact: true}},
			flood:   netip.MustParsePrefix("10.0.0.0/16"), floodCount: 1 << 16,
			maxRows: 4 * aggLevelRows,
			check: func(t *testing.T, rows []audit.Event) {
				for _, r := range rows {
					if r.Fields["prefix"] == "10.0.0.0/16" {
						if d := r.Fields["distinct"].(int); d < 60000 && r.Fields["distinctCapped"] != true {
							t.Errorf("the /16 row counts %d distinct addresses and does not say at least", d)
						}
						return
					}
				}
				t.Errorf("no row folds the addresses of 10.0.0.0/16")
			},
		},
		{
			name: "a sweep of names does not hide another name",
			rate: 0.001,
			events: func() []audit.Event {
				var out []audit.Event
				for i := range 5000 {
					if i == 2500 {
						out = append(out, dnsEvent("needle.other.test", audit.Denied, at(i)))
					}
					out = append(out, dnsEvent(fmt.Sprintf("q%d.exfil.test", i), audit.Denied, at(i)))
				}
				return out
			},
			needles: []needle{{host: "needle.other.test", decision: audit.Denied, exact: true}},
			maxRows: aggChildren + 3,
			check: func(t *testing.T, rows []audit.Event) {
				var flood int64
				for _, r := range rows {
					h, _ := r.Fields["host"].(string)
					if r.Fields["domain"] == "exfil.test" {
						// More names than a row counts: "at least".
						if r.Fields["distinct"] != aggDistinctRow || r.Fields["distinctCapped"] != true || !strings.Contains(r.Reason, "at least") || !strings.Contains(r.Reason, "*.exfil.test") {
							t.Errorf("the domain row = %v %q, want at least %d distinct names of exfil.test", r.Fields, r.Reason, aggDistinctRow)
						}
					} else if !strings.HasSuffix(h, ".exfil.test") {
						continue
					}
					flood += r.Fields["count"].(int64)
				}
				if flood != 5000 {
					t.Errorf("rows of exfil.test count %d queries, want 5000", flood)
				}
			},
		},
		{
			name: "an allowed connection inside a denied sweep's range keeps its own row",
			rate: 0.001,
			events: func() []audit.Event {
				var out []audit.Event
				for i := range 1 << 16 {
					if i == 30000 {
						out = append(out, connectEvent("10.0.3.4:443", audit.Allowed, at(i)))
					}
					out = append(out, connectEvent(fmt.Sprintf("10.0.%d.%d:443", i>>8, i&0xff), audit.Denied, at(i)))
				}
				return out
			},
			needles: []needle{{dst: "10.0.3.4:443", decision: audit.Allowed, exact: true}},
			flood:   netip.MustParsePrefix("10.0.0.0/16"), floodCount: 1 << 16,
			maxRows: 4 * aggLevelRows,
		},
		{
			name: "a sweep spread to use up the finer rows does not hide a connection to a range it left alone",
			rate: 0.001,
			events: func() []audit.Event {
				var out []audit.Event
				for i := range 100 {
					for p := range 20 {
						out = append(out, connectEvent(fmt.Sprintf("%d.%d.%d.%d:%d", i+1, p, p, p, 1000+p), audit.Denied, at(i)))
					}
				}
				return append(out, connectEvent("203.0.113.9:443", audit.Denied, at(100)))
			},
			needles: []needle{{dst: "203.0.113.9:443", decision: audit.Denied}},
			maxRows: familyRows,
		},
		{
			name: "destinations no top-level row can take are counted in the family's row",
			rate: 0.001,
			events: func() []audit.Event {
				var out []audit.Event
				for i := range 300 {
					dst := fmt.Sprintf("[2001:%x::1]:80", i+1)
					out = append(out, connectEvent(dst, audit.Denied, t0), connectEvent(dst, audit.Denied, t0))
				}
				return out
			},
			maxRows: familyRows + 1,
			check: func(t *testing.T, rows []audit.Event) {
				r := rows[len(rows)-1]
				if r.Fields["more"] != true || r.Fields["fold"] != foldMore || r.Fields["destinations"] != 300-aggTopRows || r.Fields["destinationsCapped"] != false ||
					r.Fields["count"] != int64(2*(300-aggTopRows)) || !strings.Contains(r.Reason, "more destinations") || !strings.Contains(r.Reason, audit.Denied) {
					t.Errorf("the last row = %v %q, want the %d past the top-level rows", r.Fields, r.Reason, 300-aggTopRows)
				}
			},
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
			rows := a.drain(audit.Event{SandboxID: "sb"}, tc.rate, false)
			if len(rows) > tc.maxRows {
				t.Errorf("%d rows, want at most %d", len(rows), tc.maxRows)
			}
			var counted, flood int64
			for i, r := range rows {
				n, _ := r.Fields["count"].(int64)
				counted += n
				if r.Action != audit.ActionSuppressed || n < 1 || r.SandboxID != "sb" || r.TeamID != "team" || r.Kind != audit.KindEgress {
					t.Errorf("row %d = %s %s team %q count %v", i, r.Action, r.Decision, r.TeamID, r.Fields["count"])
				}
				if r.Fields["first"] == nil || r.Fields["last"] == nil || r.Fields["recordAction"] == nil {
					t.Errorf("row %d has no first and last time or action: %v", i, r.Fields)
				}
				if tc.flood.IsValid() && r.Decision == audit.Denied && within(r, tc.flood) {
					flood += n
				}
			}
			if int64(admitted)+counted != total {
				t.Errorf("%d written + %d counted, want all %d", admitted, counted, total)
			}
			if tc.flood.IsValid() && flood != tc.floodCount {
				t.Errorf("rows inside %s count %d records, want the flood's %d", tc.flood, flood, tc.floodCount)
			}
			for _, nd := range tc.needles {
				found := false
				for _, r := range rows {
					exact, named := names(r, nd.decision, nd.dst, nd.host)
					if named && (exact || !nd.exact) {
						found = true
						if exact && r.Fields["count"] != int64(1) && nd.dst != "198.51.100.7:22" {
							t.Errorf("the row of %s%s counts %v records, want its own 1", nd.dst, nd.host, r.Fields["count"])
						}
					}
				}
				if !found {
					t.Errorf("no %s row names %s%s (exact %v) among %d rows", nd.decision, nd.dst, nd.host, nd.exact, len(rows))
				}
			}
			if tc.check != nil {
				tc.check(t, rows)
			}
			if again := a.drain(audit.Event{SandboxID: "sb"}, tc.rate, false); len(again) != 0 {
				t.Errorf("a second drain returned %d rows, want a new, empty window", len(again))
			}
		})
	}
}

// TestAggregatorBounds: a million distinct destinations in one window
// take a bounded number of rows and bounded memory, every record is
// counted, an allowed connection sent in the middle keeps its own row and
// a denied name is named at worst by its own suffix (the flood covers it).
func TestAggregatorBounds(t *testing.T) {
	if testing.Short() {
		t.Skip("a million records")
	}
	const n = 1_000_000
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	rng := rand.New(rand.NewPCG(1, 2))
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	a := newAggregator(0.001, 0.01)
	for i := range n {
		if i == n/2 {
			a.admit(connectEvent("203.0.113.9:443", audit.Allowed, t0))
			a.admit(dnsEvent("needle.other.test", audit.Denied, t0))
		}
		var b [4]byte
		for j := range b {
			b[j] = byte(rng.UintN(256))
		}
		a.admit(connectEvent(netip.AddrPortFrom(netip.AddrFrom4(b), uint16(rng.UintN(65536))).String(), audit.Denied, t0))
		a.admit(dnsEvent(fmt.Sprintf("q%d.d%d.test", i, i%1000), audit.Denied, t0))
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	a.mu.Lock()
	families, distinct := len(a.trees), a.distinct
	for f, tr := range a.trees {
		if tr.nodes > familyRows {
			t.Errorf("%v holds %d rows, want at most %d", f, tr.nodes, familyRows)
		}
	}
	a.mu.Unlock()
	if families != 3 || distinct > aggDistinctTotal {
		t.Errorf("the window holds %d families and %d distinct members, want 3 and at most %d", families, distinct, aggDistinctTotal)
	}
	grew := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	if grew > 32<<20 {
		t.Errorf("the window holds %d MiB, want a bounded few", grew>>20)
	}
	t.Logf("%d families, %d distinct members, %d KiB", families, distinct, grew>>10)
	rows := a.drain(audit.Event{SandboxID: "sb"}, 1, false)
	if len(rows) > 3*(familyRows+1) {
		t.Errorf("%d rows, want at most %d", len(rows), 3*(familyRows+1))
	}
	var counted int64
	needle, name := false, false
	for _, r := range rows {
		counted += r.Fields["count"].(int64)
		if exact, _ := names(r, audit.Allowed, "203.0.113.9:443", ""); exact {
			needle = true
		}
		if exact, _ := names(r, audit.Denied, "", "needle.other.test"); exact || r.Fields["domain"] == "other.test" || r.Fields["domain"] == "test" {
			name = true
		}
		if r.Fields["distinctCapped"] == true && !strings.Contains(r.Reason, "at least") {
			t.Errorf("row %v counts distinct members up to a bound but does not say at least: %q", r.Fields, r.Reason)
		}
	}
	if counted != 2*n+2 {
		t.Errorf("the rows count %d records, want all %d", counted, 2*n+2)
	}
	if !needle || !name {
		t.Errorf("the needles are not named (connection %v, name %v)", needle, name)
	}
}

func TestAggregatorTimes(t *testing.T) {
	a := newAggregator(0.001, 0.01)
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, d := range []time.Duration{3 * time.Second, time.Second, 7 * time.Second} {
		a.admit(connectEvent("198.51.100.1:80", audit.Denied, t0.Add(d)))
	}
	rows := a.drain(audit.Event{SandboxID: "sb"}, 1, true)
	if len(rows) != 1 {
		t.Fatalf("%d rows, want 1", len(rows))
	}
	if f, l := rows[0].Fields["first"], rows[0].Fields["last"]; f != t0.Add(time.Second).Format(time.RFC3339Nano) || l != t0.Add(7*time.Second).Format(time.RFC3339Nano) {
		t.Errorf("first %v last %v", f, l)
	}
	if rows[0].TeamID != "team" {
		t.Errorf("team %q, want the records' team", rows[0].TeamID)
	}
	if rows[0].Fields["kernelDropped"] != true || !strings.Contains(rows[0].Reason, "at least") {
		t.Errorf("a window with kernel drops: %v %q, want kernelDropped and at least", rows[0].Fields, rows[0].Reason)
	}
}

// TestEmitQueueFull: a record the rate admits but the writer's queue has
// no room for is counted in the window's rows, not dropped.
func TestEmitQueueFull(t *testing.T) {
	s := &Server{log: slog.New(slog.NewTextHandler(io.Discard, nil)), auditQ: make(chan audit.Event, 1), stop: make(chan struct{})}
	s.cfg.Limits.setDefaults()
	b := &binding{id: "sb", q: newQuota(s.cfg.Limits)}
	t0 := time.Now()
	s.emit(b, connectEvent("198.51.100.1:80", audit.Denied, t0))
	s.emit(b, connectEvent("203.0.113.9:443", audit.Allowed, t0))
	if got := (<-s.auditQ).Fields["dst"]; got != "198.51.100.1:80" {
		t.Errorf("queued %v, want the first record", got)
	}
	rows := b.q.audit.drain(audit.Event{SandboxID: "sb"}, 1, false)
	if len(rows) != 1 || rows[0].Fields["dst"] != "203.0.113.9:443" || rows[0].Decision != audit.Allowed {
		t.Errorf("rows %v, want the record the queue had no room for", rows)
	}
}

// BenchmarkAggregatorHold is the cost of counting one record of a sweep
// over the audit rate: the kernel log's reader pays it for every refused
// SYN, so it bounds the flood the reader keeps up with.
func BenchmarkAggregatorHold(b *testing.B) {
	t0 := time.Now()
	for _, tc := range []struct {
		name string
		ev   func(i int) audit.Event
	}{
		{"addresses", func(i int) audit.Event {
			return connectEvent(netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), 80).String(), audit.Denied, t0)
		}},
		{"names", func(i int) audit.Event { return dnsEvent(fmt.Sprintf("q%d.exfil.test", i), audit.Denied, t0) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			evs := make([]audit.Event, 4096)
			for i := range evs {
				evs[i] = tc.ev(i)
			}
			a := newAggregator(0.001, 0.01)
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				a.hold(evs[i%len(evs)])
			}
		})
	}
}
