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
	m.mu.Lock()
	if m.life.createSlots == nil {
		m.life.createSlots = make(chan struct{}, createSlots(goruntime.GOMAXPROCS(0)))
	}
	slots := m.life.createSlots
	m.mu.Unlock()
	select {
	case slots <- struct{}{}:
		return func() { <-slots }, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for a create slot: %w", ctx.Err())
	}
}

// createSlots is how many cold creates set up at once on procs CPUs:
// two per CPU keeps both the CPUs and the waits on I/O busy.
func createSlots(procs int) int {
	return max(2, 2*procs)
}
