package sandbox

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/runtime"
)

// HealthError is the Health value of a sandbox whose envd or container died.
const HealthError = "error"

// limitInterval is how often limit counters are read: often enough that an
// agent finds the explanation of a killed command right after it failed.
const limitInterval = 2 * time.Second

// SetAudit makes the manager append lifecycle and limit events to l.
// Call before Run.
func (m *Manager) SetAudit(l *audit.Log) { m.audit = l }

// Audit returns the audit log (nil if none).
func (m *Manager) Audit() *audit.Log { return m.audit }

func (m *Manager) auditLifecycle(ctx context.Context, sb *Sandbox, action, decision, reason string, fields map[string]any) {
	if m.audit == nil {
		return
	}
	if fields == nil {
		fields = map[string]any{}
	}
	fields["template"] = sb.TemplateID
	if sb.BuildID != "" {
		fields["build"] = sb.BuildID
	}
	if sb.Isolation != "" {
		fields["isolation"] = sb.Isolation
	}
	m.audit.Record(ctx, audit.Event{SandboxID: sb.ID, TeamID: sb.TeamID, APIKeyID: sb.APIKeyID, Kind: audit.KindLifecycle,
		Action: action, Decision: decision, Reason: reason, Fields: fields})
}

func (m *Manager) auditLimit(ctx context.Context, sb *Sandbox, action, reason string, fields map[string]any) {
	m.log.Warn("sandbox hit a limit", "sandbox", sb.ID, "limit", action, "reason", reason)
	if m.audit == nil {
		return
	}
	m.audit.Record(ctx, audit.Event{SandboxID: sb.ID, TeamID: sb.TeamID, APIKeyID: sb.APIKeyID, Kind: audit.KindLimit,
		Action: action, Decision: audit.Denied, Reason: reason, Fields: fields})
}

// limitWatch remembers the last counters seen per sandbox.
type limitWatch struct {
	mu       sync.Mutex
	counters map[string]runtime.LimitCounters
	diskFull map[string]bool
}

// watch checks envd health and limit counters until ctx ends.
func (m *Manager) watch(ctx context.Context) {
	health := time.NewTicker(m.cfg.HealthInterval)
	limits := time.NewTicker(limitInterval)
	defer health.Stop()
	defer limits.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-health.C:
			m.checkHealth(ctx)
		case <-limits.C:
			m.checkLimits(ctx)
		}
	}
}

// CheckHealth runs one health pass now (tests, and the API on demand).
func (m *Manager) CheckHealth(ctx context.Context) { m.checkHealth(ctx) }

func (m *Manager) checkHealth(ctx context.Context) {
	var wg sync.WaitGroup
	for _, sb := range m.Running() {
		wg.Go(func() {
			reason := m.probe(ctx, sb)
			m.setHealth(ctx, sb.ID, reason)
			if reason != "" {
				m.endIfDead(ctx, sb) // reconcile.go
			}
		})
	}
	wg.Wait()
}

// probe returns "" when the sandbox is healthy, else why not.
func (m *Manager) probe(ctx context.Context, sb *Sandbox) string {
	st, err := m.rt.State(ctx, sb.ID)
	switch {
	case err != nil:
		return "the sandbox's container is gone (" + err.Error() + "); kill it and create a new one"
	case st == runtime.StatusPaused:
		return "" // frozen on purpose
	case st != runtime.StatusRunning:
		return "the sandbox's container has stopped: its init process (envd) or a process running it (gVisor's sentry or gofer, the microVM's QEMU) exited or was killed, e.g. by the host's OOM killer; files and processes are lost, kill it and create a new one"
	}
	c := m.envdOf(sb)
	if err := c.Health(ctx); err != nil {
		return fmt.Sprintf("envd (the in-sandbox agent) does not answer on %s/health: %v; the sandbox cannot run commands or serve files", c.URL(), err)
	}
	return ""
}

func (m *Manager) setHealth(ctx context.Context, id, reason string) {
	m.mu.Lock()
	sb, ok := m.sandboxes[id]
	if !ok || sb.State != StateRunning {
		m.mu.Unlock()
		return
	}
	was := sb.HealthReason
	if reason == was {
		m.mu.Unlock()
		return
	}
	if reason == "" {
		sb.Health, sb.HealthReason = "", ""
	} else {
		sb.Health, sb.HealthReason = HealthError, reason
	}
	snap := clone(sb)
	m.mu.Unlock()
	if err := m.save(ctx, snap); err != nil {
		m.log.Error("persist health", "sandbox", id, "err", err)
	}
	if reason != "" {
		m.log.Warn("sandbox unhealthy", "sandbox", id, "reason", reason)
		m.auditLifecycle(ctx, snap, "unhealthy", audit.Info, reason, nil)
	} else {
		m.log.Info("sandbox healthy again", "sandbox", id)
		m.auditLifecycle(ctx, snap, "recovered", audit.Info, "health check passes again after: "+was, nil)
	}
}

func (m *Manager) checkLimits(ctx context.Context) {
	lr, ok := m.rt.(runtime.LimitReporter)
	m.limits.mu.Lock()
	if m.limits.counters == nil {
		m.limits.counters = map[string]runtime.LimitCounters{}
		m.limits.diskFull = map[string]bool{}
	}
	m.limits.mu.Unlock()
	running := m.Running()
	alive := map[string]bool{}
	for _, sb := range running {
		alive[sb.ID] = true
		if ok {
			if c, err := lr.LimitCounters(ctx, sb.ID); err == nil {
				m.limitCounters(ctx, sb, c)
			}
		}
		if sb.DiskMB > 0 {
			if st, err := m.rt.Stats(ctx, sb.ID); err == nil && st.DiskTotal > 0 {
				m.diskCheck(ctx, sb, st)
			}
		}
	}
	m.limits.mu.Lock()
	for id := range m.limits.counters {
		if !alive[id] {
			delete(m.limits.counters, id)
			delete(m.limits.diskFull, id)
		}
	}
	m.limits.mu.Unlock()
}

func (m *Manager) limitCounters(ctx context.Context, sb *Sandbox, c runtime.LimitCounters) {
	m.limits.mu.Lock()
	last, seen := m.limits.counters[sb.ID]
	m.limits.counters[sb.ID] = c
	m.limits.mu.Unlock()
	if !seen {
		// First look (also after a restart): report what happened so far.
		last = runtime.LimitCounters{}
	}
	if n := c.OOMKills - last.OOMKills; c.OOMKills > last.OOMKills {
		reason := fmt.Sprintf("out of memory: %d process(es) were killed because the sandbox used its whole memory limit of %d MiB", n, sb.MemoryMB)
		if sb.TmpMB > 0 {
			reason += fmt.Sprintf(" (files in /tmp count as memory: up to %d MiB)", sb.TmpMB)
		}
		reason += fmt.Sprintf("; use less memory (smaller inputs, streaming, fewer parallel workers) or create the sandbox with a larger memoryMB (team quota %d MiB)", m.quotaOf(ctx, sb.TeamID).MemoryMB)
		if ti, _ := runtime.TierOf(sb.Isolation); ti.OOMHint != "" {
			reason += "; " + ti.OOMHint
		}
		m.auditLimit(ctx, sb, "oom", reason, map[string]any{"killed": n, "memoryMB": sb.MemoryMB})
	}
	if n := c.PIDsMax - last.PIDsMax; c.PIDsMax > last.PIDsMax {
		reason := fmt.Sprintf("process limit: %d fork/clone call(s) failed because the sandbox already runs its limit of %d processes and threads; wait for processes to end, kill runaway ones, or create the sandbox with a larger pids (team quota %d)", n, sb.PIDs, m.quotaOf(ctx, sb.TeamID).PIDs)
		m.auditLimit(ctx, sb, "pids", reason, map[string]any{"refused": n, "pids": sb.PIDs})
	}
	if n := c.GuardKills - last.GuardKills; c.GuardKills > last.GuardKills {
		reason := fmt.Sprintf("host memory guard: the sandbox's cost on the host (its processes' memory plus, under gvisor, a host process and kernel memory per address space) neared its memory limit of %d MiB, so the server killed the command with the most processes (%d time(s)) before the host's OOM killer stopped the whole sandbox; the sandbox, its files and its other commands remain. A fork bomb or a program that starts processes without bound does this: bound the processes it starts, or create the sandbox with a larger memoryMB (team quota %d MiB)", sb.MemoryMB, n, m.quotaOf(ctx, sb.TeamID).MemoryMB)
		m.auditLimit(ctx, sb, "host-memory", reason, map[string]any{"killed": n, "memoryMB": sb.MemoryMB})
	}
}

// diskFull reports whether a writable disk is used up: under 2 MiB free,
// less than a write can use.
func diskFull(st runtime.Stats) bool {
	return st.DiskTotal > 0 && int64(st.DiskTotal)-int64(st.DiskUsed) < 2<<20
}

func (m *Manager) diskCheck(ctx context.Context, sb *Sandbox, st runtime.Stats) {
	free := int64(st.DiskTotal) - int64(st.DiskUsed)
	full := diskFull(st)
	m.limits.mu.Lock()
	was := m.limits.diskFull[sb.ID]
	if full || free > int64(st.DiskTotal)/20 {
		m.limits.diskFull[sb.ID] = full
	}
	m.limits.mu.Unlock()
	if full && !was {
		reason := fmt.Sprintf("disk full: the sandbox's writable disk of %d MiB is used up, so writes fail with \"No space left on device\"; delete files you no longer need (e.g. caches, build outputs) or create the sandbox with a larger diskSizeMB (team quota %d MiB)", sb.DiskMB, m.quotaOf(ctx, sb.TeamID).DiskMB)
		m.auditLimit(ctx, sb, "disk", reason, map[string]any{"diskSizeMB": sb.DiskMB, "usedBytes": st.DiskUsed})
	}
}
