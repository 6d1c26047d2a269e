package sandbox

import (
	"context"
	"fmt"
	"log/slog"
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
// answers, and paces the limit checks (limits.go). It writes each verdict
// on the sandbox's record through recs, and ends the traffic of a sandbox
// found dead through idle.
type health struct {
	rt       runtime.Runtime
	log      *slog.Logger
	inst     *instruments
	rows     rows
	recs     records
	idle     *idleState
	interval time.Duration
	limits   *limits
	running  func() []*Sandbox
	envd     func(*Sandbox) *envdclient.Client
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
				h.endIfDead(ctx, sb) // reconcile.go
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

// set records the verdict ("" healthy, else why not) on running sandbox
// id's record, persisted and audited when it changed.
func (h *health) set(ctx context.Context, id, reason string) {
	var was string
	var snap *Sandbox
	h.recs.one(id, func(sb *Sandbox) {
		if sb.State != StateRunning || reason == sb.HealthReason {
			return
		}
		was = sb.HealthReason
		if reason == "" {
			sb.Health, sb.HealthReason = "", ""
		} else {
			sb.Health, sb.HealthReason = HealthError, reason
		}
		snap = clone(sb)
	})
	if snap == nil {
		return
	}
	if err := h.rows.save(ctx, snap); err != nil {
		h.log.Error("persist health", "sandbox", id, "err", err)
	}
	if reason != "" {
		h.log.Warn("sandbox unhealthy", "sandbox", id, "reason", reason)
		h.inst.auditLifecycle(ctx, snap, "unhealthy", audit.Info, reason, nil)
	} else {
		h.log.Info("sandbox healthy again", "sandbox", id)
		h.inst.auditLifecycle(ctx, snap, "recovered", audit.Info, "health check passes again after: "+was, nil)
	}
}
