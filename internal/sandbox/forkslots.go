package sandbox

import "context"

// forkSlot admits one copy of a fork into its restore. Forks have their
// own, wider slots than cold creates (admission.go): a copy's restore
// waits a good part of its time (on runc's hooks, CRIU's RPCs to runc and
// the image reads), so at two per CPU the host sits idle a quarter of the
// fork while later copies queue; at five per CPU it stays busy. The copies
// of one call all share a single read-only image, so they add no I/O
// burst of their own.
func (a *admission) forkSlot(ctx context.Context) (release func(), err error) {
	return a.slot(ctx, &a.forkSlots, forkSlots, "fork") // admission.go
}

// forkSlots is how many fork copies restore at once on procs CPUs.
func forkSlots(procs int) int {
	return max(4, 5*procs)
}
