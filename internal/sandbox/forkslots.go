package sandbox

import (
	"context"
	"fmt"
	goruntime "runtime"
)

// forkSlot admits one copy of a fork into its restore. Forks have their
// own, wider slots than cold creates (admission.go): a copy's restore
// waits a good part of its time (on runc's hooks, CRIU's RPCs to runc and
// the image reads), so at two per CPU the host sits idle a quarter of the
// fork while later copies queue; at five per CPU it stays busy. The copies
// of one call all share a single read-only image, so they add no I/O
// burst of their own.
func (m *Manager) forkSlot(ctx context.Context) (release func(), err error) {
	m.mu.Lock()
	if m.life.forkSlots == nil {
		m.life.forkSlots = make(chan struct{}, forkSlots(goruntime.GOMAXPROCS(0)))
	}
	slots := m.life.forkSlots
	m.mu.Unlock()
	select {
	case slots <- struct{}{}:
		return func() { <-slots }, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for a fork slot: %w", ctx.Err())
	}
}

// forkSlots is how many fork copies restore at once on procs CPUs.
func forkSlots(procs int) int {
	return max(4, 5*procs)
}
