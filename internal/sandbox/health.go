package sandbox

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/envdclient"
	"github.com/agentbox/agentbox/internal/runtime"
)

// HealthError is the Health value of a sandbox whose envd or container died.
const HealthError = "error"

// limitInterval is how often limit counters are read: often enough that an
// agent finds the explanation of a killed command right after it failed.
const limitInterval = 2 * time.Second

// Audit returns the audit log (nil if none).
func (m *Manager) Audit() *audit.Log { return m.inst.audit }

// health checks that every running sandbox's container runs and its envd
// answers, and paces the limit checks (limits.go). What it needs of the
// manager comes in as function fields: the running sandboxes, their envd
// clients, and what to do with a verdict (setHealth, endIfDead), which
// stay with the records.
type health struct {
	rt       runtime.Runtime
	interval time.Duration
	limits   *limits
	running  func() []*Sandbox
	envd     func(*Sandbox) *envdclient.Client
	// set records the verdict ("" healthy, else why not) of sandbox id.
	set func(ctx context.Context, id, reason string)
	// dead reconciles a sandbox that failed its check with the host.
	dead func(ctx context.Context, sb *Sandbox)
}

// watch checks envd health and limit counters until ctx ends.
func (h *health) watch(ctx context.Context) {
	healthTick := time.NewTicker(h.interval)
	limits := time.NewTicker(limitInterval)
	defer healthTick.Stop()
	defer limits.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-healthTick.C:
			h.check(ctx)
		case <-limits.C:
			h.limits.check(ctx)
		}
	}
}

// check runs one health pass over the running sandboxes.
func (h *health) check(ctx context.Context) {
	var wg sync.WaitGroup
	for _, sb := range h.running() {
		wg.Go(func() {
			reason := h.probe(ctx, sb)
			h.set(ctx, sb.ID, reason)
			if reason != "" {
				h.dead(ctx, sb) // reconcile.go
			}
		})
	}
	wg.Wait()
}

// probe returns "" when the sandbox is healthy, else why not.
func (h *health) probe(ctx context.Context, sb *Sandbox) string {
	st, err := h.rt.State(ctx, sb.ID)
	switch {
	case err != nil:
		return "the sandbox's container is gone (" + err.Error() + "); kill it and create a new one"
	case st == runtime.StatusPaused:
		return "" // frozen on purpose
	case st != runtime.StatusRunning:
		return "the sandbox's container has stopped: its init process (envd) or a process running it (gVisor's sentry or gofer, the microVM's QEMU) exited or was killed, e.g. by the host's OOM killer; files and processes are lost, kill it and create a new one"
	}
	c := h.envd(sb)
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
	if err := m.rows.save(ctx, snap); err != nil {
		m.log.Error("persist health", "sandbox", id, "err", err)
	}
	if reason != "" {
		m.log.Warn("sandbox unhealthy", "sandbox", id, "reason", reason)
		m.inst.auditLifecycle(ctx, snap, "unhealthy", audit.Info, reason, nil)
	} else {
		m.log.Info("sandbox healthy again", "sandbox", id)
		m.inst.auditLifecycle(ctx, snap, "recovered", audit.Info, "health check passes again after: "+was, nil)
	}
}
