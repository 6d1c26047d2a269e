package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/envdclient"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/store"
)

// Config tunes the manager.
type Config struct {
	MaxTimeout     time.Duration // longest allowed lifetime from now
	EnvdReadyWait  time.Duration // how long to wait for envd after the container starts
	ReapInterval   time.Duration // how often expired sandboxes are looked for
	SampleInterval time.Duration // how often metrics are sampled; default DefaultSampleInterval
	HealthInterval time.Duration // how often every sandbox's envd is checked
	Quota          Quota         // the most a create may ask for, unless the team has its own (quota.go)
	// MaxCommandLifetime caps every command's run time (cmdlife.go).
	MaxCommandLifetime time.Duration
	// TokenSecret, when set, is the HMAC secret of envd access and traffic
	// tokens instead of the store's own (serve --token-secret-file): servers
	// sharing it compute the same tokens.
	TokenSecret []byte
}

func (c *Config) defaults() {
	if c.MaxTimeout == 0 {
		c.MaxTimeout = 24 * time.Hour
	}
	if c.EnvdReadyWait == 0 {
		c.EnvdReadyWait = 20 * time.Second
	}
	if c.ReapInterval == 0 {
		c.ReapInterval = time.Second
	}
	if c.SampleInterval == 0 {
		c.SampleInterval = DefaultSampleInterval
	}
	if c.HealthInterval == 0 {
		c.HealthInterval = 30 * time.Second
	}
	if c.Quota == (Quota{}) {
		c.Quota = DefaultQuota()
	}
	if c.MaxCommandLifetime == 0 {
		c.MaxCommandLifetime = DefaultMaxCommandLifetime
	}
}

// Manager runs the lifecycle of every sandbox of this server. It keeps the
// records and their state machine (begin, commit, rollback, Reconcile);
// each other concern is a part with its own lock that reaches the records
// through the records interface: the start pipelines (starter), pauses
// (pauser), snapshots, forks and moves (Snapshotter), the clock and the
// data plane's waking (reaper), warm pools, admission, health and limits,
// and metric sampling (Sampler). Lock order: admission, then the records
// (Manager.mu), then a part's own lock (idle, pools); a part never calls
// into the manager with its own lock held.
type Manager struct {
	cfg       Config
	log       *slog.Logger
	store     *store.Store
	rows      rows     // the sandbox table of store
	policies  policies // network settings to policies (network.go)
	rt        runtime.Runtime
	net       Network
	templates Templates
	envd      *envdLink  // every envd call and token (envd.go)
	limits    *limits    // OOM/pids/disk counters, own lock (limits.go)
	pools     *WarmPools // warm pools, own lock (pool.go)
	admission *admission // quota, slots, disk guard; own lock (admission.go)
	health    *health    // envd and container checks (health.go)
	snapshots *snapshots // the snapshot catalogue and its collection (snapshot.go)
	metering  *metering  // usage to the meter (usage.go)
	sampler   *Sampler   // stats sampling at each tick, metric sources (metrics.go)

	mu        sync.Mutex
	sandboxes map[string]*Sandbox
	samples   *samples   // metric samples, own lock (metrics.go)
	idle      *idleState // data-plane activity, own lock (idle.go)
	life      lifecycle  // pause/resume, snapshots, forks, pools (lifecycle.go); fixed at New

	inst        *instruments // audit, observer, tracer, step hook, crash point
	start       *starter     // the start pipelines (pipeline.go)
	pauser      *pauser      // pauses and resumes (pause.go)
	snapshotter *Snapshotter // snapshots, forks and moves (snapshotter.go)
	reaper      *reaper      // timeouts, idle handling, pools' tick; waking on traffic (reaper.go)
}

// Options is what a manager is made of, given once to New: its settings,
// the host it drives and the services it reports to. A nil service is off.
type Options struct {
	Config Config
	// Lifecycle enables pause/resume, snapshots, forks and warm pools.
	Lifecycle LifecycleConfig
	Log       *slog.Logger
	Store     *store.Store
	Runtime   runtime.Runtime
	Network   Network
	Templates Templates
	// Audit receives lifecycle and limit events; nil: none are kept.
	Audit *audit.Log
	// Observer receives the manager's measurements (internal/metrics);
	// nil: none are taken.
	Observer Observer
	// Tracer traces every start pipeline: one span per run ("sandbox
	// <path>") with a child span per step, named for the step. nil traces
	// nothing at no cost.
	Tracer trace.Tracer
	// Meter receives usage observations at each sampling tick; nil: not
	// metered.
	Meter Meter
	// Volumes mounts team volumes; nil: a create asking for volume mounts
	// is refused, naming the field.
	Volumes Volumes
	// DiskGuard is asked before every create, fork, restore, build step,
	// snapshot and pause; nil: disks are not guarded.
	DiskGuard DiskGuard
}

// New makes a manager. Call Reconcile before serving, then Run.
func New(ctx context.Context, o Options) (*Manager, error) {
	cfg, log, st, rt, nw, tpl := o.Config, o.Log, o.Store, o.Runtime, o.Network, o.Templates
	cfg.defaults()
	secret := cfg.TokenSecret
	if len(secret) == 0 {
		var err error
		if secret, err = st.Secret(ctx, "envd-token"); err != nil {
			return nil, err
		}
	}
	m := &Manager{
		cfg: cfg, log: log, store: st, rows: rows{st}, policies: policies{st}, rt: rt, net: nw, templates: tpl, inst: newInstruments(log),
		envd:      &envdLink{client: envdclient.NewHTTPClient(), secret: secret, readyWait: cfg.EnvdReadyWait, net: nw},
		sandboxes: map[string]*Sandbox{},
		samples:   newSamples(),
		idle:      newIdleState(),
		life:      lifecycle{cfg: o.Lifecycle},
	}
	if o.Lifecycle.SnapshotDir != "" {
		snaps, err := openSnapshotStore(o.Lifecycle.SnapshotDir, log)
		if err != nil {
			return nil, err
		}
		m.life.snaps = snaps
	}
	m.inst.audit, m.inst.tracer, m.inst.faultStep = o.Audit, o.Tracer, o.Lifecycle.FaultStep
	if o.Observer != nil {
		m.inst.obs = o.Observer
	}
	m.pools = newWarmPools(tpl, func() map[string]int { return readyWarm(m) })
	m.pools.configure(o.Lifecycle.Pools, o.Lifecycle.PoolMax)
	m.admission = newAdmission(log, cfg.Quota, st, func(teamID string, inBuild func(string) bool) int { return teamHeld(m, teamID, inBuild) })
	m.admission.disk = o.DiskGuard
	snaps := func() *snapshotStore { return m.life.snaps }
	m.start = &starter{
		cfg: cfg, log: log, inst: m.inst, rt: rt, net: nw, templates: tpl, envd: m.envd, admission: m.admission,
		policies: m.policies, rows: m.rows, vols: o.Volumes, snaps: snaps, recs: m,
	}
	m.limits = newLimits(log, rt, m.Audit, m.Running, m.admission.quotaOf)
	m.snapshots = &snapshots{log: log, store: snaps, recs: m, rows: m.rows}
	m.metering = &metering{rt: rt, meter: o.Meter, snaps: snaps, recs: m}
	m.reaper = &reaper{
		log: log, rt: rt, recs: m, idle: m.idle, pools: m.pools, maxTimeout: cfg.MaxTimeout, idleFreeze: o.Lifecycle.IdleFreeze,
		create: m.Create, snapshotsTick: m.snapshots.tick,
	}
	m.pauser = &pauser{
		log: log, inst: m.inst, rt: rt, admission: m.admission, metering: m.metering, recs: m, start: m.start, thaw: m.reaper.thaw,
		forget: func(id string) { m.samples.forget(id); m.idle.forget(id) },
	}
	m.reaper.pauser = m.pauser
	m.snapshotter = &Snapshotter{
		cfg: cfg, log: log, inst: m.inst, rt: rt, templates: tpl, admission: m.admission, envd: m.envd,
		store: snaps, snaps: m.snapshots, recs: m, start: m.start, thaw: m.reaper.thaw,
	}
	m.sampler = &Sampler{log: log, rt: rt, recs: m, running: m.Running, samples: m.samples, metering: m.metering}
	m.health = &health{rt: rt, log: log, inst: m.inst, rows: m.rows, recs: m, idle: m.idle, interval: cfg.HealthInterval, limits: m.limits, running: m.Running, envd: m.envd.of}
	return m, nil
}

// Snapshots takes, lists, deletes, forks and moves the sandboxes'
// snapshots.
func (m *Manager) Snapshots() *Snapshotter { return m.snapshotter }

// Sampler is the sandboxes' metrics: samples, state counts and the newest
// figures of each.
func (m *Manager) Sampler() *Sampler { return m.sampler }

// Token returns the envd access token of sandbox id.
func (m *Manager) Token(id string) string { return m.envd.token(id) }

// rows is the sandbox table of the store: one row per sandbox, written
// before the host is touched so that Reconcile finds every sandbox.
type rows struct{ st *store.Store }

// save writes sb's row.
func (r rows) save(ctx context.Context, sb *Sandbox) error {
	doc, err := json.Marshal(sb)
	if err != nil {
		return err
	}
	return r.st.PutSandbox(ctx, store.Record{ID: sb.ID, TeamID: sb.TeamID, State: string(sb.State), StartedAt: sb.StartedAt, EndAt: sb.EndAt, Doc: doc})
}

// drop deletes sandbox id's row.
func (r rows) drop(ctx context.Context, id string) error { return r.st.DeleteSandbox(ctx, id) }

// Create starts a sandbox and returns once its envd answers and is
// initialised: restored from one of the team's snapshots when req.Template
// names one, claimed from a warm pool when one fits, else started cold from
// the template. All three are the pipeline of pipeline.go with a step
// swapped.
func (m *Manager) Create(ctx context.Context, req CreateRequest) (*Sandbox, error) {
	if req.ID != "" {
		if err := m.checkChosenID(req.ID); err != nil {
			return nil, err
		}
		return m.start.run(ctx, coldStart(), newBuild("create", req))
	}
	if snap, ok := m.snapshots.team(req.TeamID, req.Template); ok {
		b := newBuild("restore", req)
		b.snap, b.tplID = snap, snap.ID
		return m.start.run(ctx, restoreSnapshot(), b)
	}
	if m.pools.fits(req) {
		b := newBuild("claim", req)
		sb, err := m.start.run(ctx, claimPooled(), b)
		switch {
		case err == nil:
			return sb, nil
		case b.failed == StepReserve:
			return nil, err // a cold start would be refused the same way
		case !errors.Is(err, errNoClaim):
			m.log.Warn("warm sandbox claim failed; cold start instead", "sandbox", b.sb.ID, "err", err)
		}
	}
	return m.start.run(ctx, coldStart(), newBuild("create", req))
}

// checkChosenID refuses a caller-chosen id that is malformed or taken.
func (m *Manager) checkChosenID(id string) error {
	if !ValidID(id) {
		return fmt.Errorf("sandbox id %q: want 2-64 characters of a-z and 0-9: %w", id, errdefs.ErrInvalidArgument)
	}
	m.mu.Lock()
	_, taken := m.sandboxes[id]
	m.mu.Unlock()
	if taken {
		return fmt.Errorf("sandbox id %q is already used; choose another: %w", id, errdefs.ErrConflict)
	}
	return nil
}

// checkTimeout refuses a lifetime d that is negative or over limit.
func checkTimeout(limit, d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("timeout: must be 0 or more seconds: %w", errdefs.ErrInvalidArgument)
	}
	if d > limit {
		return fmt.Errorf("timeout: %s is over the maximum of %s; pass at most %d seconds: %w", d, limit, int(limit.Seconds()), errdefs.ErrInvalidArgument)
	}
	return nil
}

func clone(sb *Sandbox) *Sandbox {
	c := *sb
	c.Metadata = maps.Clone(sb.Metadata)
	c.EnvVars = maps.Clone(sb.EnvVars)
	c.VolumeMounts = slices.Clone(sb.VolumeMounts)
	return &c
}

// visibleTo reports whether teamID's API calls see sb ("" = the server
// itself). A build step's sandbox is the builder's alone.
func visibleTo(sb *Sandbox, teamID string) bool {
	return teamID == "" || (sb.TeamID == teamID && sb.BuildID == "")
}

func notFound(id string) error { return NotFound(id) }

// Get returns a copy of the team's sandbox ("" team: any, for the server
// itself).
func (m *Manager) Get(ctx context.Context, teamID, id string) (*Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sb, ok := m.sandboxes[id]
	if !ok || !visibleTo(sb, teamID) {
		return nil, notFound(id)
	}
	return clone(sb), nil
}

// Lookup is the gateway's view: any team, only running sandboxes.
func (m *Manager) Lookup(id string) (*Sandbox, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sb, ok := m.sandboxes[id]
	if !ok || sb.State != StateRunning || sb.BuildID != "" {
		return nil, false
	}
	return clone(sb), true
}

// Running returns copies of every running sandbox (for signature routing).
func (m *Manager) Running() []*Sandbox {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]*Sandbox, 0, len(m.sandboxes))
	for _, sb := range m.sandboxes {
		if sb.State == StateRunning && sb.BuildID == "" {
			out = append(out, clone(sb))
		}
	}
	return out
}

// List returns the team's sandboxes, newest first.
func (m *Manager) List(ctx context.Context, teamID string) []*Sandbox {
	m.mu.Lock()
	out := make([]*Sandbox, 0, len(m.sandboxes))
	for _, sb := range m.sandboxes {
		if sb.TeamID == teamID && sb.BuildID == "" && listable(sb.State) {
			out = append(out, clone(sb))
		}
	}
	m.mu.Unlock()
	slices.SortFunc(out, func(a, b *Sandbox) int {
		if c := b.StartedAt.Compare(a.StartedAt); c != 0 {
			return c
		}
		return cmpString(a.ID, b.ID)
	})
	return out
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// register makes sb visible: the API, the gateway and the reaper see it
// from now on (a build step's sandbox only the reaper).
func (m *Manager) register(sb *Sandbox) {
	m.mu.Lock()
	m.sandboxes[sb.ID] = clone(sb)
	m.mu.Unlock()
	m.idle.touch(sb.ID)
}

// each calls f on every live record under the records' lock (records).
func (m *Manager) each(f func(sb *Sandbox)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, sb := range m.sandboxes {
		f(sb)
	}
}

// all runs f under the records' lock with every live record, which f may
// visit more than once (records).
func (m *Manager) all(f func(live iter.Seq[*Sandbox])) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f(maps.Values(m.sandboxes))
}

// one calls f on sandbox id's live record under the records' lock; false
// when there is none (records).
func (m *Manager) one(id string, f func(sb *Sandbox)) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	sb, ok := m.sandboxes[id]
	if ok {
		f(sb)
	}
	return ok
}

// discard ends a sandbox no client holds (a failed warm claim, a build
// step's sandbox once its commands ran): its live record, if any, is
// marked killing, then it is destroyed.
func (m *Manager) discard(ctx context.Context, sb *Sandbox, why string) error {
	m.mu.Lock()
	if live := m.sandboxes[sb.ID]; live != nil {
		live.State = StateKilling
	}
	m.mu.Unlock()
	c := clone(sb)
	c.State = StateKilling
	return m.destroy(context.WithoutCancel(ctx), c, why)
}

// Kill stops and removes the team's sandbox and everything it held.
func (m *Manager) Kill(ctx context.Context, teamID, id string) error {
	m.mu.Lock()
	sb, ok := m.sandboxes[id]
	if !ok || !visibleTo(sb, teamID) {
		m.mu.Unlock()
		return notFound(id)
	}
	// Paused sandboxes can be killed too; transitions finish first.
	if err := killable(sb); err != nil {
		m.mu.Unlock()
		return err
	}
	running := sb.State == StateRunning
	sb.State = StateKilling
	snapshot := clone(sb)
	m.mu.Unlock()
	if running {
		m.metering.last(ctx, snapshot)
	}
	return m.destroy(context.WithoutCancel(ctx), snapshot, "killed")
}

// destroy removes a sandbox that is already marked killing (or was never
// adopted). Every step is idempotent, so an interrupted destroy is finished by
// the next Reconcile.
func (m *Manager) destroy(ctx context.Context, sb *Sandbox, why string) error {
	if err := m.rows.save(ctx, sb); err != nil {
		m.log.Error("persist killing", "sandbox", sb.ID, "err", err)
	}
	m.inst.crashAfter("kill", KillPersisted)
	var errs []error
	if err := m.rt.Delete(ctx, sb.ID); err != nil {
		errs = append(errs, fmt.Errorf("container: %w", err))
	}
	m.inst.crashAfter("kill", KillContainerGone)
	if err := m.net.Detach(ctx, sb.ID); err != nil {
		errs = append(errs, fmt.Errorf("network: %w", err))
	}
	m.inst.crashAfter("kill", KillNetworkDetached)
	if err := errors.Join(errs...); err != nil {
		m.log.Error("sandbox cleanup incomplete; will retry at next start", "sandbox", sb.ID, "err", err)
		return fmt.Errorf("sandbox %s: %w", sb.ID, err)
	}
	if err := m.rows.drop(ctx, sb.ID); err != nil {
		return err
	}
	m.inst.crashAfter("kill", KillRowDeleted)
	m.mu.Lock()
	delete(m.sandboxes, sb.ID)
	m.mu.Unlock()
	m.samples.forget(sb.ID)
	m.idle.ended(sb.ID)
	m.inst.auditLifecycle(ctx, sb, "remove", "info", why, nil)
	m.log.Info("sandbox removed", "sandbox", sb.ID, "why", why)
	return nil
}

// SetTimeout sets the sandbox to end d from now (it may shorten the life).
func (m *Manager) SetTimeout(ctx context.Context, teamID, id string, d time.Duration) error {
	if err := checkTimeout(m.cfg.MaxTimeout, d); err != nil {
		return err
	}
	var out *Sandbox
	if err := m.update(ctx, teamID, id, func(sb *Sandbox) { sb.EndAt = time.Now().UTC().Add(d); out = clone(sb) }); err != nil {
		return err
	}
	m.inst.auditLifecycle(ctx, out, "update", audit.Allowed, "", map[string]any{"end_at": out.EndAt.Format(time.RFC3339)})
	return nil
}

// Extend makes the sandbox live at least d from now; it never shortens.
func (m *Manager) Extend(ctx context.Context, teamID, id string, d time.Duration) (*Sandbox, error) {
	if err := checkTimeout(m.cfg.MaxTimeout, d); err != nil {
		return nil, err
	}
	var out *Sandbox
	err := m.update(ctx, teamID, id, func(sb *Sandbox) {
		if end := time.Now().UTC().Add(d); end.After(sb.EndAt) {
			sb.EndAt = end
		}
		out = clone(sb)
	})
	return out, err
}

func (m *Manager) update(ctx context.Context, teamID, id string, f func(*Sandbox)) error {
	m.mu.Lock()
	sb, ok := m.sandboxes[id]
	if !ok || !visibleTo(sb, teamID) || sb.State != StateRunning {
		m.mu.Unlock()
		return notFound(id)
	}
	f(sb)
	snapshot := clone(sb)
	m.mu.Unlock()
	return m.rows.save(ctx, snapshot)
}

// Reconcile makes the in-memory view, the database, the runtime and the
// network agree after a start: running sandboxes whose container and network
// are intact are adopted; everything else is removed so nothing leaks.
func (m *Manager) Reconcile(ctx context.Context) error {
	records, err := m.store.ListSandboxes(ctx)
	if err != nil {
		return err
	}
	adopted := map[string]bool{}
	for _, r := range records {
		var sb Sandbox
		if err := json.Unmarshal(r.Doc, &sb); err != nil {
			m.log.Error("unreadable sandbox record; removing", "sandbox", r.ID, "err", err)
			sb = Sandbox{ID: r.ID, TeamID: r.TeamID}
		}
		if sb.BuildID != "" {
			// Its build job died with the server; the build reports the failure.
			sb.State = StateKilling
			_ = m.destroy(ctx, &sb, "template build step interrupted by a server restart")
			continue
		}
		// Paused sandboxes and interrupted transitions (lifecycle.go).
		if m.reconcileLifecycle(ctx, &sb, adopted) {
			continue
		}
		reason := ""
		switch {
		case sb.State != StateRunning:
			reason = "was " + string(sb.State) + " when the server stopped"
		default:
			st, err := m.rt.State(ctx, sb.ID)
			if err != nil {
				reason = "container is gone: " + err.Error()
			} else if st != runtime.StatusRunning {
				reason = "container is " + string(st)
			} else if _, ok := m.net.Lookup(sb.ID); !ok {
				reason = "network namespace is gone"
			}
		}
		if reason != "" {
			m.log.Warn("removing sandbox after restart", "sandbox", sb.ID, "why", reason)
			sb.State = StateKilling
			_ = m.destroy(ctx, &sb, reason)
			continue
		}
		// The nftables table is rebuilt at every start; put the sandbox's
		// egress policy back before it is reachable again.
		if err := m.policies.restore(ctx, m.net, m.log, &sb); err != nil {
			m.log.Error("restore egress policy; removing sandbox", "sandbox", sb.ID, "err", err)
			sb.State = StateKilling
			_ = m.destroy(ctx, &sb, "could not restore its egress policy")
			continue
		}
		m.mu.Lock()
		m.sandboxes[sb.ID] = &sb
		m.mu.Unlock()
		adopted[sb.ID] = true
		m.log.Info("sandbox re-adopted", "sandbox", sb.ID, "ip", sb.IP)
	}
	// Orphans: runtime or network state without a database record (a crash
	// between the two, or state from a deleted database).
	if ids, err := m.rt.List(ctx); err == nil {
		for _, id := range ids {
			if !adopted[id] {
				m.log.Warn("removing orphaned container", "sandbox", id)
				if err := m.rt.Delete(ctx, id); err != nil {
					m.log.Error("remove orphaned container", "sandbox", id, "err", err)
				}
			}
		}
	} else {
		m.log.Error("list containers", "err", err)
	}
	if ids, err := m.net.List(ctx); err == nil {
		for _, id := range ids {
			if !adopted[id] {
				m.log.Warn("removing orphaned network namespace", "sandbox", id)
				if err := m.net.Detach(ctx, id); err != nil {
					m.log.Error("remove orphaned netns", "sandbox", id, "err", err)
				}
			}
		}
	} else {
		m.log.Error("list network namespaces", "err", err)
	}
	m.snapshotter.reconcile(ctx) // crash.go
	return nil
}

// Run reaps expired sandboxes and samples metrics until ctx ends.
func (m *Manager) Run(ctx context.Context) {
	reap := time.NewTicker(m.cfg.ReapInterval)
	sample := time.NewTicker(m.cfg.SampleInterval)
	defer reap.Stop()
	defer sample.Stop()
	m.sampler.tick(ctx)
	go m.health.watch(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-reap.C:
			m.reaper.reap(ctx)
		case <-sample.C:
			m.sampler.tick(ctx)
		}
	}
}
