package sandbox

import (
	"context"
	"fmt"
	"log/slog"
	goruntime "runtime"
	"sync"

	"github.com/agentbox/agentbox/internal/store"
)

// admission decides whether work may start: the team's quota and its
// maxSandboxes and maxBuilds (quota.go), the disk guard (diskguard.go) and
// the host's create and fork slots. It keeps the reservations, admitted
// builds and slots under its own lock; the sandboxes it counts are the
// manager's records, read through held. Lock order: admission.mu before
// Manager.mu, never the reverse (the manager calls in without m.mu held).
type admission struct {
	log    *slog.Logger
	quota  Quota      // the server's default quota (Config.Quota)
	quotas teamQuotas // the teams' stored quotas
	// held counts teamID's sandboxes that are not being killed, leaving out
	// those of a build for which inBuild reports true.
	held func(teamID string, inBuild func(buildID string) bool) int

	disk DiskGuard // nil: disks are not guarded (Options.DiskGuard)

	mu          sync.Mutex
	createSlots chan struct{}     // cold creates in host setup
	forkSlots   chan struct{}     // fork copies in their restore (forkslots.go)
	reserved    map[string]int    // creates in flight per team, for maxSandboxes
	builds      map[string]string // template builds in progress: build ID -> team
}

// teamQuotas reads a team's stored quota.
type teamQuotas interface {
	TeamQuota(ctx context.Context, teamID string) (store.TeamQuota, bool, error)
}

func newAdmission(log *slog.Logger, q Quota, quotas teamQuotas, held func(string, func(string) bool) int) *admission {
	return &admission{log: log, quota: q, quotas: quotas, held: held, reserved: map[string]int{}, builds: map[string]string{}}
}

// createSlot admits one cold create into its host setup (network namespace,
// veth, nftables, container start, envd init). A burst past a few per CPU
// gains nothing: the work is CPU- and rtnl-lock-bound, and unbounded it
// only stretches every create (netlink calls queue behind each other for
// seconds) instead of finishing the early ones first. Waiting creates are
// served in arrival order as slots free up.
func (a *admission) createSlot(ctx context.Context) (release func(), err error) {
	return a.slot(ctx, &a.createSlots, createSlots, "create")
}

// slot takes one of the slots in *slots (made on first use with
// size(GOMAXPROCS) of them) and returns its release. Waiters are served in
// arrival order; what names the slot in the error.
func (a *admission) slot(ctx context.Context, slots *chan struct{}, size func(procs int) int, what string) (release func(), err error) {
	a.mu.Lock()
	if *slots == nil {
		*slots = make(chan struct{}, size(goruntime.GOMAXPROCS(0)))
	}
	ch := *slots
	a.mu.Unlock()
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
