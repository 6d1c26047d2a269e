package sandbox

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/agentbox/agentbox/internal/runtime"
)

// Metric is one sample of a sandbox's resource use (E2B SandboxMetric).
type Metric struct {
	Timestamp  time.Time
	CPUCount   int
	CPUUsedPct float64
	MemUsed    uint64
	MemCache   uint64
	MemTotal   uint64
	DiskUsed   uint64
	DiskTotal  uint64
}

// series keeps the last hour of samples of one sandbox.
type series struct {
	last    runtime.Stats
	samples []Metric
}

const keepSamples = 720

// Sampler is the sandboxes' metrics: it reads every running sandbox's
// stats at each sampling tick into the samples and hands them on to usage
// metering, and it is what the metrics API and exporter read (Metrics,
// LatestSamples, StateCounts). Callers reach it through Manager.Sampler;
// it reaches the records through recs.
type Sampler struct {
	log      *slog.Logger
	rt       runtime.Runtime
	recs     records
	running  func() []*Sandbox
	samples  *samples
	metering *metering
}

func (p *Sampler) tick(ctx context.Context) {
	stats := map[string]runtime.Stats{}
	for _, sb := range p.running() {
		st, err := p.rt.Stats(ctx, sb.ID)
		if err != nil {
			p.log.Debug("sample stats", "sandbox", sb.ID, "err", err)
			continue
		}
		p.samples.record(sb, st)
		stats[sb.ID] = st
	}
	p.metering.tick(ctx, stats)
}

// samples keeps the last hour of every running sandbox's metric samples,
// under a lock of its own: sampling and the metrics API never wait on the
// lifecycle's.
type samples struct {
	mu     sync.Mutex
	series map[string]*series
}

func newSamples() *samples { return &samples{series: map[string]*series{}} }

// record adds st as sb's newest sample and returns it.
func (s *samples) record(sb *Sandbox, st runtime.Stats) Metric {
	s.mu.Lock()
	defer s.mu.Unlock()
	se := s.series[sb.ID]
	if se == nil {
		se = &series{}
		s.series[sb.ID] = se
	}
	pt := Metric{
		Timestamp: st.Timestamp, CPUCount: sb.CPUCount,
		MemUsed: st.MemoryUsed, MemCache: st.MemoryCache, MemTotal: st.MemoryLimit,
		DiskUsed: st.DiskUsed, DiskTotal: st.DiskTotal,
	}
	if pt.MemTotal == 0 || pt.MemTotal > uint64(sb.MemoryMB)<<20 && sb.MemoryMB > 0 {
		pt.MemTotal = uint64(sb.MemoryMB) << 20
	}
	if !se.last.Timestamp.IsZero() && st.CPUUsageNanos >= se.last.CPUUsageNanos {
		wall := st.Timestamp.Sub(se.last.Timestamp)
		cpus := max(sb.CPUCount, 1)
		if wall > 0 {
			pt.CPUUsedPct = float64(st.CPUUsageNanos-se.last.CPUUsageNanos) / float64(wall.Nanoseconds()*int64(cpus)) * 100
		}
	}
	se.last = st
	se.samples = append(se.samples, pt)
	if len(se.samples) > keepSamples {
		se.samples = se.samples[len(se.samples)-keepSamples:]
	}
	return pt
}

// empty reports whether id has no sample yet.
func (s *samples) empty(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	se := s.series[id]
	return se == nil || len(se.samples) == 0
}

// between returns id's samples between start and end (zero = unbounded).
func (s *samples) between(id string, start, end time.Time) []Metric {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Metric
	if se := s.series[id]; se != nil {
		for _, pt := range se.samples {
			if (!start.IsZero() && pt.Timestamp.Before(start)) || (!end.IsZero() && pt.Timestamp.After(end)) {
				continue
			}
			out = append(out, pt)
		}
	}
	return out
}

// last returns id's newest raw counters, if it was sampled.
func (s *samples) last(id string) (runtime.Stats, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if se := s.series[id]; se != nil && !se.last.Timestamp.IsZero() {
		return se.last, true
	}
	return runtime.Stats{}, false
}

// forget drops id's samples (it stopped running).
func (s *samples) forget(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.series, id)
}

// Metrics returns the samples of the team's sandbox between start and end
// (zero = unbounded). With no sample yet it takes one now, so a fresh sandbox
// answers with real figures at once.
func (p *Sampler) Metrics(ctx context.Context, teamID, id string, start, end time.Time) ([]Metric, error) {
	sb, err := p.recs.Get(ctx, teamID, id)
	if err != nil {
		return nil, err
	}
	if p.samples.empty(id) {
		st, err := p.rt.Stats(ctx, id)
		if err != nil {
			return nil, err
		}
		p.samples.record(sb, st)
	}
	return p.samples.between(id, start, end), nil
}

// Latest is the newest sample of one running team sandbox.
type Latest struct {
	ID, TeamID string
	Sampled    bool    // false: not sampled yet, the figures below are zero
	CPUSeconds float64 // cumulative, since the sandbox's cgroup was made
	MemUsed    uint64  // bytes, page cache excluded
	DiskUsed   uint64  // bytes of the writable layer
}

// LatestSamples returns the newest sample of every running team sandbox
// (warm-pool members and build sandboxes left out).
func (p *Sampler) LatestSamples() []Latest {
	var out []Latest
	p.recs.each(func(sb *Sandbox) {
		if metered(sb) && sb.State == StateRunning {
			out = append(out, Latest{ID: sb.ID, TeamID: sb.TeamID})
		}
	})
	for i, l := range out {
		if st, ok := p.samples.last(l.ID); ok {
			out[i].Sampled, out[i].CPUSeconds, out[i].MemUsed, out[i].DiskUsed = true, float64(st.CPUUsageNanos)/1e9, st.MemoryUsed, st.DiskUsed
		}
	}
	if out == nil {
		out = []Latest{}
	}
	return out
}

// StateCount is how many sandboxes are in one state on one tier.
type StateCount struct {
	State     State
	Isolation string
	Count     int
}

// StateCounts counts every sandbox the manager holds (warm pool members and
// build sandboxes included) by state and tier.
func (p *Sampler) StateCounts() []StateCount {
	type key struct {
		state State
		iso   string
	}
	counts := map[key]int{}
	p.recs.each(func(sb *Sandbox) {
		iso := sb.Isolation
		if iso == "" {
			iso = IsolationContainer
		}
		counts[key{sb.State, iso}]++
	})
	out := make([]StateCount, 0, len(counts))
	for k, n := range counts {
		out = append(out, StateCount{State: k.state, Isolation: k.iso, Count: n})
	}
	return out
}
