package sandbox

import (
	"context"

	"github.com/agentbox/agentbox/internal/runtime"
)

// endIfDead reconciles the data plane with the host after a failed health
// check: when sb's container is gone or stopped (its init, envd, killed; a
// runtime process or the microVM's QEMU died), every stream in flight to
// it (a command's output, a PTY, a watch, a proxied port) is ended now.
// A dead peer does not always reset its connections: under gVisor the
// network stack dies with the sentry and a stream would wait forever.
// The sandbox stays listed with health "error" and its reason until its
// owner kills it, which frees its resources as for any sandbox.
func (h *health) endIfDead(ctx context.Context, sb *Sandbox) {
	st, err := h.rt.State(ctx, sb.ID)
	if err == nil && (st == runtime.StatusRunning || st == runtime.StatusPaused) {
		return // envd is slow or restarting: its container still runs
	}
	still := false
	h.recs.one(sb.ID, func(cur *Sandbox) { still = cur.State == StateRunning })
	if !still {
		return // paused, killed or moved meanwhile: its own path ends the traffic
	}
	h.idle.ended(sb.ID)
}
