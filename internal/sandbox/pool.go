package sandbox

import (
	"context"
	"maps"
	"math"
	"slices"
	"sync"
	"time"
)

// poolTeam owns warm sandboxes until a create claims one; no API key maps
// to it, so they are invisible to every team.
const poolTeam = "agentbox-warm-pool"

// pool is the warm pool of one template.
type pool struct {
	ref        string // as configured ("base")
	templateID string
	min        int
	target     int
	filling    int
	// claims counts each team's hits and misses (what each team may see
	// of its own); the pool's are their sums.
	claims  map[string]*teamClaims
	creates []time.Time // recent creates of the template, for the adaptive size
}

// PoolStats describes one warm pool.
type PoolStats struct {
	Template   string `json:"template"`
	TemplateID string `json:"templateID"`
	Ready      int    `json:"ready"`
	Filling    int    `json:"filling"`
	Min        int    `json:"min"`
	Target     int    `json:"target"`
	Hits       uint64 `json:"hits"`
	Misses     uint64 `json:"misses"`
}

// claimable says whether sb is a warm sandbox a create may claim: running,
// healthy and no team's yet.
func claimable(sb *Sandbox) bool {
	return sb.TeamID == poolTeam && sb.State == StateRunning && sb.Health == ""
}

// teamClaims counts one team's claims on a pool.
type teamClaims struct{ hits, misses uint64 }

// team returns team's counts, made on first use.
func (p *pool) team(team string) *teamClaims {
	if p.claims == nil {
		p.claims = map[string]*teamClaims{}
	}
	c := p.claims[team]
	if c == nil {
		c = &teamClaims{}
		p.claims[team] = c
	}
	return c
}

// poolWindow is how far back creates count for the pool size, and
// refillTime how long one warm sandbox takes to make. poolTrimPerTick is
// how many surplus warm sandboxes go per tick once demand falls.
const (
	poolWindow      = 5 * time.Minute // longer than refilling after a burst of 100 takes on a busy 2-core host
	refillTime      = 2 * time.Second
	poolTrimPerTick = 4
)

// poolTarget is the adaptive size of a pool whose configured minimum is
// minSize and cap maxSize, given the times of its template's recent
// creates (claims and misses, oldest first, none older than poolWindow):
// the minimum plus the larger of what the recent create rate consumes
// while one sandbox refills (twice over) and the largest burst seen within
// one refill time. A burst is absorbed from the next one on; a quiet
// window shrinks the pool back to its minimum. Never over max(maxSize,
// minSize).
func poolTarget(minSize, maxSize int, creates []time.Time) int {
	rate := float64(len(creates)) / poolWindow.Seconds()
	demand := int(math.Ceil(2 * rate * refillTime.Seconds()))
	// The most creates within any refillTime: a sliding window.
	lo := 0
	for hi := range creates {
		for creates[hi].Sub(creates[lo]) >= refillTime {
			lo++
		}
		demand = max(demand, hi-lo+1)
	}
	return min(minSize+demand, max(maxSize, minSize))
}

// WarmPools owns the warm pools: their configuration, sizes, refills in
// flight and claim counts, under its own lock. The sandboxes themselves are
// the manager's records; what it needs of them comes in as ready. Lock
// order: Manager.mu before WarmPools.mu, never the reverse.
type WarmPools struct {
	templates Templates
	// ready counts the claimable warm sandboxes per template id.
	ready func() map[string]int

	mu    sync.Mutex
	cfg   map[string]int // template reference -> minimum size
	max   int            // cap of each pool's adaptive size
	byTpl map[string]*pool
}

func newWarmPools(tpl Templates, ready func() map[string]int) *WarmPools {
	return &WarmPools{templates: tpl, ready: ready, max: 32, byTpl: map[string]*pool{}}
}

// configure sets the pools to keep (Options.Lifecycle, at New).
func (w *WarmPools) configure(pools map[string]int, max int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.cfg = maps.Clone(pools)
	if max > 0 {
		w.max = max
	}
}

// enabled reports whether any pool is configured.
func (w *WarmPools) enabled() bool {
	if w == nil {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.cfg) > 0
}

// resolve adds the configured pools whose templates now exist.
func (w *WarmPools) resolve(ctx context.Context) {
	w.mu.Lock()
	known := map[string]bool{}
	for _, p := range w.byTpl {
		known[p.ref] = true
	}
	cfg := maps.Clone(w.cfg)
	w.mu.Unlock()
	for ref, size := range cfg {
		if known[ref] {
			continue
		}
		tpl, err := w.templates.Get(ctx, "", ref)
		if err != nil {
			continue // not built yet; try at the next tick
		}
		w.mu.Lock()
		w.byTpl[tpl.ID] = &pool{ref: ref, templateID: tpl.ID, min: size, target: size}
		w.mu.Unlock()
	}
}

// poolFill is a number of refills to start for one template.
type poolFill struct {
	templateID string
	n          int
}

// plan resizes each pool to its recent create rate given the ready warm
// sandboxes, and returns the refills to start (counted as filling from
// here on) and each pool's target.
func (w *WarmPools) plan(now time.Time, ready map[string]int) (fills []poolFill, targets map[string]int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	targets = map[string]int{}
	for id, p := range w.byTpl {
		p.creates = slices.DeleteFunc(p.creates, func(t time.Time) bool { return now.Sub(t) > poolWindow })
		slices.SortFunc(p.creates, time.Time.Compare) // claims record their arrival, which finish out of order
		p.target = poolTarget(p.min, w.max, p.creates)
		targets[id] = p.target
		// At most two cold starts at a time: refills must not starve the
		// creates they are meant to speed up.
		if n := min(p.target-ready[id]-p.filling, 2-p.filling); n > 0 {
			p.filling += n
			fills = append(fills, poolFill{id, n})
		}
	}
	return fills, targets
}

// filled marks one refill of template id done.
func (w *WarmPools) filled(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if p := w.byTpl[id]; p != nil {
		p.filling--
	}
}

// demand records a create of template id that arrived at t, and reports
// whether the template has a pool.
func (w *WarmPools) demand(id string, t time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	p := w.byTpl[id]
	if p == nil {
		return false
	}
	p.creates = append(p.creates, t)
	return true
}

// claimed counts a team's hit or miss on template id's pool.
func (w *WarmPools) claimed(id, team string, hit bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	p := w.byTpl[id]
	if p == nil {
		return
	}
	if hit {
		p.team(team).hits++
	} else {
		p.team(team).misses++
	}
}

// fits reports whether a warm sandbox can serve req: warm sandboxes
// have the template's defaults, so requests for other limits, another tier,
// egress rules or another command cap start cold (which honours them).
func (w *WarmPools) fits(req CreateRequest) bool {
	return w.enabled() && req.TeamID != poolTeam && req.Limits == (Limits{}) &&
		(req.Isolation == "" || req.Isolation == IsolationContainer) && req.Metadata[MetadataIsolation] == "" &&
		req.Network == nil && req.MaxCommand == 0 && len(req.VolumeMounts) == 0 && req.Workdir == ""
}

// configured reports whether a warm pool is configured for template id.
func (w *WarmPools) configured(ctx context.Context, id string) bool {
	if w == nil {
		return false
	}
	w.mu.Lock()
	cfg := maps.Clone(w.cfg)
	w.mu.Unlock()
	for ref := range cfg {
		if tpl, err := w.templates.Get(ctx, "", ref); err == nil && tpl.ID == id {
			return true
		}
	}
	return false
}

// List reports the warm pools.
func (w *WarmPools) List() []PoolStats {
	ready := w.ready()
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]PoolStats, 0, len(w.byTpl))
	for id, p := range w.byTpl {
		st := PoolStats{Template: p.ref, TemplateID: id, Ready: ready[id], Filling: p.filling, Min: p.min, Target: p.target}
		for _, c := range p.claims {
			st.Hits += c.hits
			st.Misses += c.misses
		}
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b PoolStats) int { return cmpString(a.Template, b.Template) })
	return out
}

// Team reports the warm pools as team may see them: the configured
// template and minimum, and the team's own hits and misses. Ready, filling
// and the adaptive target follow every team's creates and claims, so they
// would tell one tenant when another uses the template; they stay 0 here
// (the operator's metrics have them).
func (w *WarmPools) Team(team string) []PoolStats {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]PoolStats, 0, len(w.byTpl))
	for id, p := range w.byTpl {
		st := PoolStats{Template: p.ref, TemplateID: id, Min: p.min}
		if c := p.claims[team]; c != nil {
			st.Hits, st.Misses = c.hits, c.misses
		}
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b PoolStats) int { return cmpString(a.Template, b.Template) })
	return out
}

// Pools returns the warm pools.
func (m *Manager) Pools() *WarmPools { return m.pools }

// readyWarm counts the claimable warm sandboxes of recs per template id
// (WarmPools.ready).
func readyWarm(recs records) map[string]int {
	ready := map[string]int{}
	recs.each(func(sb *Sandbox) {
		if claimable(sb) {
			ready[sb.TemplateID]++
		}
	})
	return ready
}

// claimWarm hands a claimable warm sandbox of template tplID to teamID:
// hidden from the pool and from other claims from here on, it is the
// team's and creating. nil when the pool cannot serve the request (no
// demand recorded, none ready, a timeout over the maximum), which counts
// as a miss.
func (m *Manager) claimWarm(tplID, teamID string, at time.Time, timeout time.Duration) *Sandbox {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.pools.demand(tplID, at) {
		return nil
	}
	var sb *Sandbox
	for _, c := range m.sandboxes {
		if claimable(c) && c.TemplateID == tplID {
			sb = c
			break
		}
	}
	if sb == nil || checkTimeout(m.cfg.MaxTimeout, timeout) != nil {
		m.pools.claimed(tplID, teamID, false)
		return nil
	}
	m.pools.claimed(tplID, teamID, true)
	sb.State = StateCreating
	sb.TeamID = teamID
	return clone(sb)
}

// resolvePooled claims a warm sandbox of the requested template for the
// request: it takes the request's team, env, metadata, network policy,
// token and lifetime. errNoClaim on a miss (the create starts cold).
func (s *starter) resolvePooled(ctx context.Context, b *build) error {
	req := b.req
	tpl, err := s.templates.Get(ctx, req.TeamID, req.Template)
	if err != nil {
		return errNoClaim
	}
	// A team whose quota is below the template's defaults starts cold,
	// where the refusal says which limit to lower.
	if _, err := resolveLimits(Limits{}, tpl, b.quota); err != nil {
		return errNoClaim
	}
	// Demand counts when the request came, not when it got a create slot:
	// a burst queues for slots, and the pool must see it as the burst it is.
	c := s.recs.claimWarm(tpl.ID, req.TeamID, b.sb.StartedAt, req.Timeout)
	if c == nil {
		return errNoClaim
	}
	// A claim that fails later leaves a sandbox that is neither warm nor
	// the team's: it goes.
	claimed := clone(c)
	b.undo.Add(StepResolve, func(ctx context.Context) error {
		go func() { _ = s.recs.discard(context.WithoutCancel(ctx), claimed, "warm claim failed") }()
		return nil
	})
	now := time.Now().UTC()
	c.APIKeyID, c.Metadata, c.EnvVars = req.APIKeyID, maps.Clone(req.Metadata), maps.Clone(req.EnvVars)
	c.Secure, c.AllowInternet = req.Secure, req.AllowInternet
	c.StartedAt, c.EndAt, c.Lifecycle = now, now.Add(req.Timeout), req.Lifecycle.apply(req.Timeout)
	b.sb = c
	// Pooled sandboxes are made secure; their token is derived from the
	// id, which the claimed sandbox keeps.
	b.fresh, b.envdAuth = false, s.envd.token(c.ID)
	b.pol, err = s.policies.of(ctx, c)
	return err
}
