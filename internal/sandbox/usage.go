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

// metering reports usage to the meter: every metered sandbox and snapshot
// at each sampling tick, and a sandbox's last figures before it pauses or
// goes. The sandboxes are the manager's records, visited through recs.
type metering struct {
	rt    runtime.Runtime
	meter Meter // nil: not metered (Options.Meter)
	recs  records
	snaps func() *snapshotStore // nil store: no snapshots
}

// tick reports every metered sandbox (running ones with the stats just
// sampled; paused and transitional ones with none, so only their disk
// accrues) and every snapshot.
func (u *metering) tick(ctx context.Context, stats map[string]runtime.Stats) {
	if u.meter == nil {
		return
	}
	now := time.Now()
	var obs []usage.Observation
	u.recs.each(func(sb *Sandbox) {
		if !metered(sb) {
			return
		}
		o := sandboxObservation(sb, now)
		if st, ok := stats[sb.ID]; ok && sb.State == StateRunning {
			o = withStats(o, st)
		}
		obs = append(obs, o)
	})
	if snaps := u.snaps(); snaps != nil {
		for _, s := range snaps.list(false) {
			if s.TeamID == "" || s.TeamID == poolTeam {
				continue
			}
			obs = append(obs, usage.Observation{Kind: usage.KindSnapshot, ID: s.ID, TeamID: s.TeamID, TemplateID: s.TemplateID,
				At: now, DiskBytes: uint64(max(s.SizeBytes, 1))})
		}
	}
	u.meter.Observe(ctx, obs)
}

// last takes a running sandbox's last figures before it pauses or is
// removed (the caller knows it ran), so the CPU it used since the last tick is not lost.
func (u *metering) last(ctx context.Context, sb *Sandbox) {
	if u.meter == nil || !metered(sb) {
		return
	}
	st, err := u.rt.Stats(ctx, sb.ID)
	if err != nil {
		return
	}
	u.meter.ObserveOne(ctx, withStats(sandboxObservation(sb, time.Now()), st))
}
