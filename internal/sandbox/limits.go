package sandbox

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/runtime"
)

// limits reads each running sandbox's OOM, pids, host-memory-guard and disk
// counters and records a limit event when one moved. It remembers the last
// counters seen per sandbox under its own lock; what it needs from the
// manager comes in as function fields, not a pointer back.
type limits struct {
	log   *slog.Logger
	rt    runtime.Runtime
	audit func() *audit.Log // nil log: no audit
	// running lists the sandboxes to look at.
	running func() []*Sandbox
	// quota names the team's limits in the advice of a refusal.
	quota func(ctx context.Context, teamID string) Quota

	mu       sync.Mutex
	counters map[string]runtime.LimitCounters
	diskFull map[string]bool
}

func newLimits(log *slog.Logger, rt runtime.Runtime, auditLog func() *audit.Log, running func() []*Sandbox, quota func(context.Context, string) Quota) *limits {
	return &limits{log: log, rt: rt, audit: auditLog, running: running, quota: quota,
		counters: map[string]runtime.LimitCounters{}, diskFull: map[string]bool{}}
}

func (l *limits) record(ctx context.Context, sb *Sandbox, action, reason string, fields map[string]any) {
	l.log.Warn("sandbox hit a limit", "sandbox", sb.ID, "limit", action, "reason", reason)
	a := l.audit()
	if a == nil {
		return
	}
	a.Record(ctx, audit.Event{SandboxID: sb.ID, TeamID: sb.TeamID, APIKeyID: sb.APIKeyID, Kind: audit.KindLimit,
		Action: action, Decision: audit.Denied, Reason: reason, Fields: fields})
}

// check runs one pass over the running sandboxes and forgets those gone.
func (l *limits) check(ctx context.Context) {
	lr, ok := l.rt.(runtime.LimitReporter)
	running := l.running()
	alive := map[string]bool{}
	for _, sb := range running {
		alive[sb.ID] = true
		if ok {
			if c, err := lr.LimitCounters(ctx, sb.ID); err == nil {
				l.counted(ctx, sb, c)
			}
		}
		if sb.DiskMB > 0 {
			if st, err := l.rt.Stats(ctx, sb.ID); err == nil && st.DiskTotal > 0 {
				l.disk(ctx, sb, st)
			}
		}
	}
	l.mu.Lock()
	for id := range l.counters {
		if !alive[id] {
			delete(l.counters, id)
			delete(l.diskFull, id)
		}
	}
	l.mu.Unlock()
}

func (l *limits) counted(ctx context.Context, sb *Sandbox, c runtime.LimitCounters) {
	l.mu.Lock()
	last, seen := l.counters[sb.ID]
	l.counters[sb.ID] = c
	l.mu.Unlock()
	if !seen {
		// First look (also after a restart): report what happened so far.
		last = runtime.LimitCounters{}
	}
	if n := c.OOMKills - last.OOMKills; c.OOMKills > last.OOMKills {
		reason := fmt.Sprintf("out of memory: %d process(es) were killed because the sandbox used its whole memory limit of %d MiB", n, sb.MemoryMB)
		if sb.TmpMB > 0 {
			reason += fmt.Sprintf(" (files in /tmp count as memory: up to %d MiB)", sb.TmpMB)
		}
		reason += fmt.Sprintf("; use less memory (smaller inputs, streaming, fewer parallel workers) or create the sandbox with a larger memoryMB (team quota %d MiB)", l.quota(ctx, sb.TeamID).MemoryMB)
		if ti, _ := runtime.TierOf(sb.Isolation); ti.OOMHint != "" {
			reason += "; " + ti.OOMHint
		}
		l.record(ctx, sb, "oom", reason, map[string]any{"killed": n, "memoryMB": sb.MemoryMB})
	}
	if n := c.PIDsMax - last.PIDsMax; c.PIDsMax > last.PIDsMax {
		reason := fmt.Sprintf("process limit: %d fork/clone call(s) failed because the sandbox already runs its limit of %d processes and threads; wait for processes to end, kill runaway ones, or create the sandbox with a larger pids (team quota %d)", n, sb.PIDs, l.quota(ctx, sb.TeamID).PIDs)
		l.record(ctx, sb, "pids", reason, map[string]any{"refused": n, "pids": sb.PIDs})
	}
	if n := c.GuardKills - last.GuardKills; c.GuardKills > last.GuardKills {
		reason := fmt.Sprintf("host memory guard: the sandbox's cost on the host (its processes' memory plus, under gvisor, a host process and kernel memory per address space) neared its memory limit of %d MiB, so the server killed the command with the most processes (%d time(s)) before the host's OOM killer stopped the whole sandbox; the sandbox, its files and its other commands remain. A fork bomb or a program that starts processes without bound does this: bound the processes it starts, or create the sandbox with a larger memoryMB (team quota %d MiB)", sb.MemoryMB, n, l.quota(ctx, sb.TeamID).MemoryMB)
		l.record(ctx, sb, "host-memory", reason, map[string]any{"killed": n, "memoryMB": sb.MemoryMB})
	}
}

// diskFull reports whether a writable disk is used up: under 2 MiB free,
// less than a write can use.
func diskFull(st runtime.Stats) bool {
	return st.DiskTotal > 0 && int64(st.DiskTotal)-int64(st.DiskUsed) < 2<<20
}

func (l *limits) disk(ctx context.Context, sb *Sandbox, st runtime.Stats) {
	free := int64(st.DiskTotal) - int64(st.DiskUsed)
	full := diskFull(st)
	l.mu.Lock()
	was := l.diskFull[sb.ID]
	if full || free > int64(st.DiskTotal)/20 {
		l.diskFull[sb.ID] = full
	}
	l.mu.Unlock()
	if full && !was {
		reason := fmt.Sprintf("disk full: the sandbox's writable disk of %d MiB is used up, so writes fail with \"No space left on device\"; delete files you no longer need (e.g. caches, build outputs) or create the sandbox with a larger diskSizeMB (team quota %d MiB)", sb.DiskMB, l.quota(ctx, sb.TeamID).DiskMB)
		l.record(ctx, sb, "disk", reason, map[string]any{"diskSizeMB": sb.DiskMB, "usedBytes": st.DiskUsed})
	}
}
