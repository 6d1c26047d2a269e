package sandbox

import (
	"context"
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

func (m *Manager) sample(ctx context.Context) {
	stats := map[string]runtime.Stats{}
	for _, sb := range m.Running() {
		st, err := m.rt.Stats(ctx, sb.ID)
		if err != nil {
			m.log.Debug("sample stats", "sandbox", sb.ID, "err", err)
			continue
		}
		m.record(sb, st)
		stats[sb.ID] = st
	}
	m.meterTick(ctx, stats)
}

func (m *Manager) record(sb *Sandbox, st runtime.Stats) Metric {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.metrics[sb.ID]
	if s == nil {
		s = &series{}
		m.metrics[sb.ID] = s
	}
	pt := Metric{
		Timestamp: st.Timestamp, CPUCount: sb.CPUCount,
		MemUsed: st.MemoryUsed, MemCache: st.MemoryCache, MemTotal: st.MemoryLimit,
		DiskUsed: st.DiskUsed, DiskTotal: st.DiskTotal,
	}
	if pt.MemTotal == 0 || pt.MemTotal > uint64(sb.MemoryMB)<<20 && sb.MemoryMB > 0 {
		pt.MemTotal = uint64(sb.MemoryMB) << 20
	}
	if !s.last.Timestamp.IsZero() && st.CPUUsageNanos >= s.last.CPUUsageNanos {
		wall := st.Timestamp.Sub(s.last.Timestamp)
		cpus := max(sb.CPUCount, 1)
		if wall > 0 {
			pt.CPUUsedPct = float64(st.CPUUsageNanos-s.last.CPUUsageNanos) / float64(wall.Nanoseconds()*int64(cpus)) * 100
		}
	}
	s.last = st
	s.samples = append(s.samples, pt)
	if len(s.samples) > keepSamples {
		s.samples = s.samples[len(s.samples)-keepSamples:]
	}
	return pt
}

// Metrics returns the samples of the team's sandbox between start and end
// (zero = unbounded). With no sample yet it takes one now, so a fresh sandbox
// answers with real figures at once.
func (m *Manager) Metrics(ctx context.Context, teamID, id string, start, end time.Time) ([]Metric, error) {
	sb, err := m.Get(ctx, teamID, id)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	s := m.metrics[id]
	empty := s == nil || len(s.samples) == 0
	m.mu.Unlock()
	if empty {
		st, err := m.rt.Stats(ctx, id)
		if err != nil {
			return nil, err
		}
		m.record(sb, st)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Metric
	for _, pt := range m.metrics[id].samples {
		if (!start.IsZero() && pt.Timestamp.Before(start)) || (!end.IsZero() && pt.Timestamp.After(end)) {
			continue
		}
		out = append(out, pt)
	}
	return out, nil
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
func (m *Manager) LatestSamples() []Latest {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Latest, 0, len(m.sandboxes))
	for id, sb := range m.sandboxes {
		if !metered(sb) || sb.State != StateRunning {
			continue
		}
		l := Latest{ID: id, TeamID: sb.TeamID}
		if s := m.metrics[id]; s != nil && !s.last.Timestamp.IsZero() {
			l.Sampled, l.CPUSeconds, l.MemUsed, l.DiskUsed = true, float64(s.last.CPUUsageNanos)/1e9, s.last.MemoryUsed, s.last.DiskUsed
		}
		out = append(out, l)
	}
	return out
}
