package envd

import (
	"context"
	"fmt"
	"time"
)

// A process's lifetime is the shorter of the request's Connect-Timeout-Ms
// and the sandbox's command lifetime cap (maxCommandSeconds in /init), so
// no command outlives the cap even when the client asked for no timeout.

// processLifetime returns the context bounding a process started under
// request ctx, and the cap when the cap (not the request) is what ends it.
func (s *Server) processLifetime(ctx context.Context) (context.Context, context.CancelFunc, time.Duration) {
	s.mu.RLock()
	limit := s.maxCommand
	s.mu.RUnlock()
	dl, ok := ctx.Deadline()
	var capped time.Duration
	if limit > 0 {
		if byCap := time.Now().Add(limit); !ok || byCap.Before(dl) {
			dl, ok, capped = byCap, true, limit
		}
	}
	if !ok {
		return context.Background(), func() {}, 0
	}
	life, cancel := context.WithDeadline(context.Background(), dl)
	return life, cancel, capped
}

// capExceededError is the end event error of a process killed by the cap;
// it names the cap so the caller knows what to change.
func capExceededError(limit time.Duration) string {
	return fmt.Sprintf("killed: the command ran longer than this sandbox's maximum command lifetime of %s (maxCommandSeconds=%d); split the job into shorter commands, or create the sandbox with a larger maxCommandSeconds (up to the server's --max-command-lifetime)",
		limit, int64(limit/time.Second))
}
