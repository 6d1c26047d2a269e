package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/agentbox/agentbox/internal/egress"
)

// failEgressProxy closes the egress proxy's listener under the running
// server every interval (--test-fail-egress-proxy, a hidden test switch
// read only from the command line), as a crash of it would: the fault
// tests check that the server notices and listens again, and that
// sandboxes keep their egress.
func failEgressProxy(ctx context.Context, eg *egress.Server, every time.Duration, log *slog.Logger) {
	if every <= 0 || eg == nil {
		return
	}
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				log.Warn("test fault: closing the egress proxy's listener")
				eg.FailProxy()
			}
		}
	}()
}
