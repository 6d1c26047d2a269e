package sandbox

import (
	"context"
	"time"

	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/usage"
)

// DefaultSampleInterval is how often running sandboxes' cgroups are read
// for metrics and usage.
const DefaultSampleInterval = 5 * time.Second

// Meter receives usage observations (internal/usage.Meter is one).
type Meter interface {
	// Observe is every metered sandbox and snapshot at one sampling tick.
	Observe(ctx context.Context, obs []usage.Observation)
	// ObserveOne is one sandbox's last figures before it pauses or goes.
	ObserveOne(ctx context.Context, o usage.Observation)
}

// SetMeter sends usage observations to u at each sampling tick. Call
// before Run.
func (m *Manager) SetMeter(u Meter) { m.meter = u }

// metered says whether a sandbox's usage is a team's: warm-pool members
// belong to no team until claimed, and build sandboxes are the server's.
func metered(sb *Sandbox) bool { return sb.TeamID != poolTeam && sb.TeamID != "" && sb.BuildID == "" }

func sandboxObservation(sb *Sandbox, at time.Time) usage.Observation {
	return usage.Observation{Kind: usage.KindSandbox, ID: sb.ID, TeamID: sb.TeamID, TemplateID: sb.TemplateID, At: at, Since: sb.StartedAt}
}

func withStats(o usage.Observation, st runtime.Stats) usage.Observation {
	o.Running = true
	if !st.Timestamp.IsZero() {
		o.At = st.Timestamp
	}
	o.CPUNanos, o.MemBytes, o.DiskBytes = st.CPUUsageNanos, st.MemoryUsed, st.DiskUsed
	return o
}

// meterTick reports every metered sandbox (running ones with the stats
// just sampled; paused and transitional ones with none, so only their disk
// accrues) and every snapshot.
func (m *Manager) meterTick(ctx context.Context, stats map[string]runtime.Stats) {
	if m.meter == nil {
		return
	}
	now := time.Now()
	var obs []usage.Observation
	m.mu.Lock()
	for _, sb := range m.sandboxes {
		if !metered(sb) {
			continue
		}
		o := sandboxObservation(sb, now)
		if st, ok := stats[sb.ID]; ok && sb.State == StateRunning {
			o = withStats(o, st)
		}
		obs = append(obs, o)
	}
	m.mu.Unlock()
	if m.life.snaps != nil {
		for _, s := range m.life.snaps.list(false) {
			if s.TeamID == "" || s.TeamID == poolTeam {
				continue
			}
			obs = append(obs, usage.Observation{Kind: usage.KindSnapshot, ID: s.ID, TeamID: s.TeamID, TemplateID: s.TemplateID,
				At: now, DiskBytes: uint64(max(s.SizeBytes, 1))})
		}
	}
	m.meter.Observe(ctx, obs)
}

// meterLast takes a running sandbox's last figures before it pauses or is
// removed (the caller knows it ran), so the CPU it used since the last tick is not lost.
func (m *Manager) meterLast(ctx context.Context, sb *Sandbox) {
	if m.meter == nil || !metered(sb) {
		return
	}
	st, err := m.rt.Stats(ctx, sb.ID)
	if err != nil {
		return
	}
	m.meter.ObserveOne(ctx, withStats(sandboxObservation(sb, time.Now()), st))
}
