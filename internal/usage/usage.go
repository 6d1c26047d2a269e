// Package usage meters what each team's sandboxes use, for billing and
// quotas: vCPU-seconds and memory GiB-seconds from cgroup accounting while
// a sandbox runs (paused time accrues nothing but disk), writable-disk and
// snapshot GiB-hours, and bytes through the egress proxy. The manager feeds
// it one observation per sandbox and snapshot at each sampling tick; the
// Meter turns consecutive observations into amounts and adds them to
// hourly rows in the store, so totals survive restarts and removals.
package usage

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Kinds of metered objects.
const (
	KindSandbox  = "sandbox"
	KindSnapshot = "snapshot"
)

const gib = 1 << 30

// Observation is one sandbox or snapshot at one sampling tick.
type Observation struct {
	Kind       string // KindSandbox or KindSnapshot
	ID         string // sandbox or snapshot id
	TeamID     string
	TemplateID string
	At         time.Time
	Running    bool   // sandbox running (not paused); CPU and memory count only then
	CPUNanos   uint64 // cumulative CPU time of the sandbox's cgroup (running only)
	MemBytes   uint64 // memory in use, page cache excluded (running only)
	DiskBytes  uint64 // writable layer, or the snapshot's size; 0 = unknown (keep the last)
	// Since is when the sandbox started (its cgroup counts from zero
	// there): a sandbox first seen running that started after the meter
	// did accrues from then, so a short burst before the first tick counts.
	Since time.Time
}

// Amount is usage accrued over some interval.
type Amount struct {
	CPUSeconds       float64
	MemoryGiBSeconds float64
	DiskGiBHours     float64 // writable disk for a sandbox, stored bytes for a snapshot
	EgressBytes      int64
}

func (a *Amount) add(b Amount) {
	a.CPUSeconds += b.CPUSeconds
	a.MemoryGiBSeconds += b.MemoryGiBSeconds
	a.DiskGiBHours += b.DiskGiBHours
	a.EgressBytes += b.EgressBytes
}

func (a Amount) zero() bool { return a == Amount{} }

// Accrue is what a sandbox or snapshot used between two consecutive
// observations of it. Intervals longer than maxGap (the server was down or
// stalled) and a change of team (a warm-pool sandbox claimed) accrue
// nothing: prev is then only a baseline. CPU and memory accrue only when
// both ends ran; a CPU counter that went backwards (a restored sandbox has
// a fresh cgroup) counts from zero.
func Accrue(prev, cur Observation, maxGap time.Duration) Amount {
	wall := cur.At.Sub(prev.At)
	if prev.At.IsZero() || wall <= 0 || wall > maxGap || prev.TeamID != cur.TeamID || prev.Kind != cur.Kind {
		return Amount{}
	}
	var a Amount
	if prev.Running && cur.Running {
		cpu := cur.CPUNanos
		if cur.CPUNanos >= prev.CPUNanos {
			cpu = cur.CPUNanos - prev.CPUNanos
		}
		a.CPUSeconds = float64(cpu) / 1e9
		a.MemoryGiBSeconds = float64(prev.MemBytes+cur.MemBytes) / 2 / gib * wall.Seconds()
	}
	a.DiskGiBHours = float64(prev.DiskBytes+cur.DiskBytes) / 2 / gib * wall.Hours()
	return a
}

// Key names one hourly row.
type Key struct {
	TeamID string
	Kind   string
	ID     string
	Hour   time.Time // start of the UTC hour
}

// Row is an accrued amount for one key, with the sandbox's template.
type Row struct {
	Key
	TemplateID string
	Amount
}

// Store persists rows by adding them to what is stored.
type Store interface {
	AddUsage(ctx context.Context, rows []Row) error
}

// Meter accrues observations and egress bytes and flushes them to the
// store. Safe for concurrent use.
type Meter struct {
	store   Store
	maxGap  time.Duration
	log     *slog.Logger
	started time.Time

	mu      sync.Mutex
	last    map[string]Observation // by Kind+"/"+ID; a sandbox's also names its template for egress rows
	pending map[Key]*Row
}

// NewMeter returns a meter for observations about interval apart.
func NewMeter(store Store, interval time.Duration, log *slog.Logger) *Meter {
	return &Meter{
		store: store, maxGap: 10 * interval, log: log, started: time.Now(),
		last: map[string]Observation{}, pending: map[Key]*Row{},
	}
}

// Observe accrues one tick's observations and flushes them. Objects not
// observed in this tick are forgotten (removed), so a later object with
// the same id starts from a fresh baseline.
func (m *Meter) Observe(ctx context.Context, obs []Observation) {
	m.mu.Lock()
	seen := make(map[string]bool, len(obs))
	for _, o := range obs {
		k := o.Kind + "/" + o.ID
		seen[k] = true
		m.observeLocked(o)
	}
	for k := range m.last {
		if !seen[k] {
			delete(m.last, k)
		}
	}
	m.mu.Unlock()
	m.Flush(ctx)
}

// ObserveOne accrues and flushes one observation outside a tick: the last
// figures of a sandbox about to pause or be removed, stored before it does.
func (m *Meter) ObserveOne(ctx context.Context, o Observation) {
	m.mu.Lock()
	m.observeLocked(o)
	m.mu.Unlock()
	m.Flush(ctx)
}

func (m *Meter) observeLocked(o Observation) {
	k := o.Kind + "/" + o.ID
	prev, ok := m.last[k]
	if !ok && o.Kind == KindSandbox && o.Running && o.Since.After(m.started) {
		// Started while this meter ran: nothing of it was metered yet.
		prev, ok = Observation{Kind: o.Kind, ID: o.ID, TeamID: o.TeamID, At: o.Since, Running: true}, true
	}
	if ok && !o.At.After(prev.At) {
		// Stale: a pause or removal observed it later already.
		return
	}
	if o.DiskBytes == 0 && ok && prev.TeamID == o.TeamID {
		// A paused sandbox is not measured: its writable layer is
		// still on disk at the size last seen.
		o.DiskBytes = prev.DiskBytes
	}
	if ok {
		if a := Accrue(prev, o, m.maxGap); !a.zero() {
			m.addLocked(o.TeamID, o.Kind, o.ID, o.TemplateID, o.At, a)
		}
	}
	m.last[k] = o
}

// Egress adds bytes a sandbox moved through the egress proxy.
func (m *Meter) Egress(teamID, sandboxID string, bytes int64, at time.Time) {
	if teamID == "" || bytes <= 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.addLocked(teamID, KindSandbox, sandboxID, m.last[KindSandbox+"/"+sandboxID].TemplateID, at, Amount{EgressBytes: bytes})
}

func (m *Meter) addLocked(team, kind, id, tpl string, at time.Time, a Amount) {
	k := Key{TeamID: team, Kind: kind, ID: id, Hour: at.UTC().Truncate(time.Hour)}
	r := m.pending[k]
	if r == nil {
		r = &Row{Key: k}
		m.pending[k] = r
	}
	if tpl != "" {
		r.TemplateID = tpl
	}
	r.Amount.add(a)
}

// Flush writes what accrued since the last flush. On a store error the
// amounts stay pending for the next flush.
func (m *Meter) Flush(ctx context.Context) {
	m.mu.Lock()
	if len(m.pending) == 0 {
		m.mu.Unlock()
		return
	}
	rows := make([]Row, 0, len(m.pending))
	for _, r := range m.pending {
		rows = append(rows, *r)
	}
	m.pending = map[Key]*Row{}
	m.mu.Unlock()
	if err := m.store.AddUsage(ctx, rows); err != nil {
		m.log.Error("usage: flush to the store failed; kept for the next one", "rows", len(rows), "err", err)
		m.mu.Lock()
		for _, r := range rows {
			m.addLocked(r.TeamID, r.Kind, r.ID, r.TemplateID, r.Hour, r.Amount)
		}
		m.mu.Unlock()
	}
}
