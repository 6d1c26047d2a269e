package sandbox

import (
	"context"
	"fmt"
	goruntime "runtime"
)

// createSlot admits one cold create into its host setup (network namespace,
// veth, nftables, container start, envd init). A burst past a few per CPU
// gains nothing: the work is CPU- and rtnl-lock-bound, and unbounded it
// only stretches every create (netlink calls queue behind each other for
// seconds) instead of finishing the early ones first. Waiting creates are
// served in arrival order as slots free up.
func (m *Manager) createSlot(ctx context.Context) (release func(), err error) {
	return m.admit(ctx, &m.life.createSlots, createSlots, "create")
}

// admit takes one of the slots in *slots (made on first use with
// size(GOMAXPROCS) of them, under m.mu) and returns its release. Waiters
// are served in arrival order; what names the slot in the error.
func (m *Manager) admit(ctx context.Context, slots *chan struct{}, size func(procs int) int, what string) (release func(), err error) {
	m.mu.Lock()
	if *slots == nil {
		*slots = make(chan struct{}, size(goruntime.GOMAXPROCS(0)))
	}
	ch := *slots
	m.mu.Unlock()
	select {
	case ch <- struct{}{}:
		return func() { <-ch }, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for a %s slot: %w", what, ctx.Err())
	}
}

// createSlots is how many cold creates set up at once on procs CPUs:
// two per CPU keeps both the CPUs and the waits on I/O busy.
func createSlots(procs int) int {
	return max(2, 2*procs)
}
