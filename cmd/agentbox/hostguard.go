package main

import (
	"context"

	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/runsc"
)

// startHostGuards starts the host-side guards of the tiers that have one
// (gVisor's host memory guard, internal/runtime/runsc/guard.go); they run
// until ctx ends.
func startHostGuards(ctx context.Context, rt *runtime.Tiers) {
	t, err := rt.Lookup(runsc.Name)
	if err != nil {
		return
	}
	if g, ok := t.Driver.(interface{ Guard(context.Context) }); ok {
		go g.Guard(ctx)
	}
}
