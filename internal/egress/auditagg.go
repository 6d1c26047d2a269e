package egress

import (
	"fmt"
	"hash/maphash"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/publicsuffix"

	"github.com/agentbox/agentbox/internal/audit"
)

// A sandbox's egress records are written one by one within its audit rate
// (Limits.AuditRate). Past it they are counted, and every aggregation
// window the counts are written as "suppressed" rows: the one place every
// egress, DNS and kernel-logged record of a sandbox goes through.
//
// Counts fold by the structure of destinations, not into one anonymous
// number. Each record walks its destination's path from coarse to fine
//
//	address:  /8 → /16 → /24 → address → address:port   (IPv6: /32 → /48 → /64 → …)
//	name:     public suffix → registrable domain → name → name with its address
//
// and is counted in the finest row it may have. Every top-level range
// gets a row (up to aggTopRows); below it, a new row is made while its
// level has fewer than aggLevelRows, and, unless it is the first below
// its parent, while the parent has fewer than aggChildren and the level
// leaves a reserve for first rows. So a sweep of many ports of one address
// folds into that address's row, a sweep of many addresses into their /24
// or /16, a sweep of names into their registrable domain, while a
// destination outside the swept range keeps a row naming its own address
// (or at worst its own prefix, with the address among the row's members
// while the row has few). Action and decision are the top of every path:
// an allowed connection is never folded with a denied flood. The family
// row ("more destinations") takes only what no top-level row could (past
// aggTopRows IPv6 /32s or public suffixes).
//
// Fields of a suppressed egress row (besides count, first and last time,
// recordAction and the decision of its records):
//
//   - fold: what the row stands for: "exact" (one destination, as before:
//     dst, host and proto), "address" (ports folded: dst is the address,
//     ports a few of them, portRange the lowest and highest), "prefix"
//     (addresses folded: prefix), "domain" (names folded: domain), "name"
//     (one name at several addresses: host), "more" (the family row: more,
//     destinations, destinationsCapped, as before);
//   - distinct: how many distinct members the row counts (ports of an
//     address, addresses of a prefix, names of a domain, destinations of a
//     family row); distinctCapped: true when counting stopped at a bound,
//     so the number is "at least";
//   - members: the first few distinct destinations folded into the row.
//
// Counts are exact. kernelDropped marks rows of a window in which the
// kernel dropped logged packets before they reached the proxy, so their
// counts are "at least".

// Bounds of one family's rows in one window (a family: one action,
// decision and kind of destination). A family holds at most
// aggTopRows + 4*aggLevelRows rows and its family row.
const (
	// aggTopRows bounds the rows of a family's top level: the /8s (all of
	// IPv4's), the IPv6 /32s, the public suffixes.
	aggTopRows = 256
	// aggLevelRows bounds the rows of each finer level of a family's
	// paths (the /16s, the /24s, ...); the last aggReserve of them only
	// go to the first row below another, so a destination in a range no
	// row holds yet still gets one.
	aggLevelRows = 32
	aggReserve   = 8
	// aggChildren bounds the finer rows below one row: the ports of an
	// address, the addresses of a /24, the names of a domain...
	aggChildren = 8
	// aggMembers is how many members a folded row names.
	aggMembers = 8
	// aggDistinctRow and aggDistinctTotal bound the members counted as
	// distinct, per row and per window; past them the count is "at least".
	aggDistinctRow   = 2048
	aggDistinctTotal = 8192
)

// aggFamily is the top of every path: rows of different actions,
// decisions or kinds of destination are never folded together.
type aggFamily struct {
	action   string // connect, request, dns
	decision string
	tree     string // "ip", "name" or "other"
}

// Kinds of rows (the fold field).
const (
	foldExact   = "exact"
	foldAddress = "address"
	foldPrefix  = "prefix"
	foldDomain  = "domain"
	foldName    = "name"
	foldMore    = "more"
)

// aggStep is one level of a destination's path.
type aggStep struct {
	label string // what the row names: "198.18.0.0/24", "198.18.6.10:7", "exfil.test"
	fold  string
	// member is the path index whose label a record folded at this level
	// counts as a distinct member.
	member int
}

// aggPath is where a record goes: its family and its path, coarse to fine.
type aggPath struct {
	fam   aggFamily
	steps []aggStep
	dst   string // the record's dst field
	host  string // the record's host field
	port  int    // -1 without one
}

func (p aggPath) leaf() string { return p.steps[len(p.steps)-1].label }

// aggNode is one row of the window: what stopped at its level of a path.
type aggNode struct {
	step     aggStep
	fam      aggFamily
	children map[string]*aggNode

	count       int64
	first, last time.Time
	reason      string
	proto       string
	dst, host   string // of an exact row
	distinct    map[uint64]struct{}
	capped      bool
	members     []string
	ports       []int
	portLo      int
	portHi      int
}

// aggTree is one family's rows.
type aggTree struct {
	root  *aggNode
	level []int // rows per level
	nodes int
}

// aggregator is one sandbox's audit rate and what it held back.
type aggregator struct {
	rate *bucket
	seed maphash.Seed

	mu             sync.Mutex
	trees          map[aggFamily]*aggTree
	order          []*aggNode // rows below the family rows, first made first
	distinct       int        // members counted as distinct in this window
	teamID, apiKey string
}

func newAggregator(rate, burst float64) *aggregator {
	return &aggregator{rate: newBucket(rate, burst), seed: maphash.MakeSeed(), trees: map[aggFamily]*aggTree{}}
}

// pathOf is the path of ev's destination: by name when the record has
// one (SNI, Host, the queried name), else by address.
func pathOf(ev audit.Event) aggPath {
	p := aggPath{fam: aggFamily{action: ev.Action, decision: ev.Decision}, port: -1}
	p.dst, _ = ev.Fields["dst"].(string)
	p.host, _ = ev.Fields["host"].(string)
	if p.host != "" {
		p.fam.tree = "name"
		p.steps = namePath(p.host, p.dst)
		return p
	}
	ap, err := netip.ParseAddrPort(p.dst)
	if err != nil {
		if a, aerr := netip.ParseAddr(p.dst); aerr == nil {
			ap = netip.AddrPortFrom(a, 0)
			err = nil
		}
	}
	if err != nil {
		p.fam.tree = "other"
		p.steps = []aggStep{{label: p.dst, fold: foldExact, member: 0}}
		return p
	}
	p.fam.tree = "ip"
	p.port = int(ap.Port())
	a := ap.Addr().Unmap()
	bits := []int{8, 16, 24}
	if a.Is6() {
		bits = []int{32, 48, 64}
	}
	for _, b := range bits {
		p.steps = append(p.steps, aggStep{label: netip.PrefixFrom(a, b).Masked().String(), fold: foldPrefix, member: len(bits)})
	}
	p.steps = append(p.steps,
		aggStep{label: a.String(), fold: foldAddress, member: len(bits) + 1},
		aggStep{label: p.dst, fold: foldExact, member: len(bits) + 1})
	return p
}

// namePath folds a name by its public suffix, then its registrable
// domain; a name seen at an address ends in a row for the pair.
func namePath(host, dst string) []aggStep {
	name := strings.TrimSuffix(strings.ToLower(host), ".")
	suffix, _ := publicsuffix.PublicSuffix(name)
	domain, err := publicsuffix.EffectiveTLDPlusOne(name)
	if err != nil {
		domain = name
	}
	var steps []aggStep
	for _, l := range []string{suffix, domain} {
		if l != "" && l != name && (len(steps) == 0 || steps[len(steps)-1].label != l) {
			steps = append(steps, aggStep{label: l, fold: foldDomain})
		}
	}
	nameAt := len(steps)
	for i := range steps {
		steps[i].member = nameAt
	}
	if dst == "" || dst == "dns" {
		return append(steps, aggStep{label: host, fold: foldExact, member: nameAt})
	}
	return append(steps,
		aggStep{label: name, fold: foldName, member: nameAt + 1},
		aggStep{label: host + " (" + dst + ")", fold: foldExact, member: nameAt + 1})
}

// admit reports whether ev may be written as it is; when not, it is
// counted in the finest row its destination may have.
func (a *aggregator) admit(ev audit.Event) bool {
	if a.rate.allow() {
		return true
	}
	a.hold(ev)
	return false
}

// hold counts ev in the window instead of writing it.
func (a *aggregator) hold(ev audit.Event) {
	at := ev.Time
	if at.IsZero() {
		at = time.Now()
	}
	p := pathOf(ev)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.teamID, a.apiKey = ev.TeamID, ev.APIKeyID
	t := a.trees[p.fam]
	if t == nil {
		t = &aggTree{root: &aggNode{fam: p.fam, step: aggStep{fold: foldMore, member: -1}}}
		a.trees[p.fam] = t
	}
	n := t.root
	for i, st := range p.steps {
		c := n.children[st.label]
		if c == nil {
			for len(t.level) <= i {
				t.level = append(t.level, 0)
			}
			// The first row below another is how a destination in a range
			// no flood touched keeps its own row: only the level's bound
			// applies to it.
			var room bool
			if i == 0 {
				room = t.level[0] < aggTopRows
			} else {
				first := len(n.children) == 0
				room = t.level[i] < aggLevelRows &&
					(first || len(n.children) < aggChildren && t.level[i] < aggLevelRows-aggReserve)
			}
			if !room {
				break
			}
			c = &aggNode{step: st, fam: p.fam}
			if n.children == nil {
				n.children = map[string]*aggNode{}
			}
			n.children[st.label] = c
			t.level[i]++
			t.nodes++
			a.order = append(a.order, c)
		}
		n = c
	}
	a.count(n, p, ev, at)
}

// count adds one record of path p to row n. Called with a.mu held.
func (a *aggregator) count(n *aggNode, p aggPath, ev audit.Event, at time.Time) {
	if n.count == 0 {
		n.first, n.last, n.reason = at, at, ev.Reason
		n.proto, _ = ev.Fields["proto"].(string)
		n.dst, n.host = p.dst, p.host
		n.portLo, n.portHi = p.port, p.port
	}
	n.count++
	n.first, n.last = minTime(n.first, at), maxTime(n.last, at)
	if n.step.fold == foldExact {
		return
	}
	member := p.leaf()
	if m := n.step.member; m >= 0 && m < len(p.steps) {
		member = p.steps[m].label
	}
	if !n.capped {
		h := maphash.String(a.seed, member)
		if _, seen := n.distinct[h]; !seen {
			if len(n.distinct) >= aggDistinctRow || a.distinct >= aggDistinctTotal {
				n.capped = true
			} else {
				if n.distinct == nil {
					n.distinct = map[uint64]struct{}{}
				}
				n.distinct[h] = struct{}{}
				a.distinct++
			}
		}
	}
	if leaf := p.leaf(); len(n.members) < aggMembers && !slices.Contains(n.members, leaf) {
		n.members = append(n.members, leaf)
	}
	if n.step.fold == foldAddress && p.port >= 0 {
		if len(n.ports) < aggMembers && !slices.Contains(n.ports, p.port) {
			n.ports = append(n.ports, p.port)
		}
		n.portLo, n.portHi = min(n.portLo, p.port), max(n.portHi, p.port)
	}
}

// drain returns the rows held back since the last drain and starts a new
// window. like labels them when no record of this window did;
// kernelDropped says the kernel dropped logged packets meanwhile.
func (a *aggregator) drain(like audit.Event, limit float64, kernelDropped bool) []audit.Event {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.trees) == 0 {
		return nil
	}
	team, key := a.teamID, a.apiKey
	if team == "" {
		team, key = like.TeamID, like.APIKeyID
	}
	var out []audit.Event
	emit := func(n *aggNode) {
		if n.count == 0 {
			return
		}
		ev := n.event(limit)
		ev.SandboxID, ev.TeamID, ev.APIKeyID, ev.Kind, ev.Action = like.SandboxID, team, key, audit.KindEgress, audit.ActionSuppressed
		if kernelDropped {
			ev.Fields["kernelDropped"] = true
			ev.Reason += "; the kernel dropped logged packets in this window, so counts are at least these"
		}
		out = append(out, ev)
	}
	for _, n := range a.order {
		emit(n)
	}
	fams := make([]aggFamily, 0, len(a.trees))
	for f := range a.trees {
		fams = append(fams, f)
	}
	sort.Slice(fams, func(i, j int) bool {
		x, y := fams[i], fams[j]
		if x.decision != y.decision {
			return x.decision < y.decision
		}
		if x.action != y.action {
			return x.action < y.action
		}
		return x.tree < y.tree
	})
	for _, f := range fams {
		emit(a.trees[f].root)
	}
	a.trees, a.order, a.distinct = map[aggFamily]*aggTree{}, nil, 0
	a.teamID, a.apiKey = "", ""
	return out
}

// event is row n as an audit event (without sandbox, team or kind).
func (n *aggNode) event(limit float64) audit.Event {
	f := n.fam
	fields := map[string]any{
		"recordAction": f.action, "count": n.count, "fold": n.step.fold,
		"first": n.first.UTC().Format(time.RFC3339Nano), "last": n.last.UTC().Format(time.RFC3339Nano),
	}
	if n.proto != "" {
		fields["proto"] = n.proto
	}
	over := fmt.Sprintf("over the audit rate of %.0f per second", limit)
	if n.step.fold == foldExact {
		fields["dst"] = n.dst
		what := n.dst
		if n.host != "" {
			fields["host"] = n.host
			what = n.step.label
		}
		return audit.Event{Time: n.first, Decision: f.decision, Fields: fields,
			Reason: fmt.Sprintf("%d more %s %s to %s %s (%s)", n.count, f.action, f.decision, what, over, n.reason)}
	}
	distinct := strconv.Itoa(len(n.distinct))
	if n.capped {
		distinct = "at least " + distinct
	}
	fields["distinct"], fields["distinctCapped"] = len(n.distinct), n.capped
	fields["members"] = append([]string(nil), n.members...)
	eg := strings.Join(n.members, ", ")
	var what, of string
	switch n.step.fold {
	case foldAddress:
		fields["dst"], fields["ports"] = n.step.label, append([]int(nil), n.ports...)
		fields["portRange"] = fmt.Sprintf("%d-%d", n.portLo, n.portHi)
		what, of = fmt.Sprintf("%s ports %d-%d", n.step.label, n.portLo, n.portHi), "ports"
	case foldPrefix:
		fields["prefix"] = n.step.label
		what, of = n.step.label, "addresses"
	case foldDomain:
		fields["domain"] = n.step.label
		what, of = "*."+n.step.label, "names"
	case foldName:
		fields["host"] = n.step.label
		what, of = n.step.label, "addresses"
	case foldMore:
		fields["more"], fields["destinations"], fields["destinationsCapped"] = true, len(n.distinct), n.capped
		return audit.Event{Time: n.first, Decision: f.decision, Fields: fields,
			Reason: fmt.Sprintf("%d more %s %s records to %s more destinations (e.g. %s) %s: past %d top-level rows a window, destinations no finer row could take are counted here",
				n.count, f.action, f.decision, distinct, eg, over, aggTopRows)}
	}
	return audit.Event{Time: n.first, Decision: f.decision, Fields: fields,
		Reason: fmt.Sprintf("%d more %s %s to %s, %s distinct %s (e.g. %s) %s: finer rows are bounded (%d below one), so destinations are folded into it (%s)",
			n.count, f.action, f.decision, what, distinct, of, eg, over, aggChildren, n.reason)}
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
