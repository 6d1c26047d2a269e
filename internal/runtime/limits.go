package runtime

import "context"

// LimitCounters are cumulative counts of limit hits of one sandbox, read
// from its cgroup. They only grow; a caller reports the increase.
type LimitCounters struct {
	OOMKills uint64 // processes killed because the memory limit was reached
	PIDsMax  uint64 // forks refused because the pids limit was reached
	// GuardKills counts the times the host-side guard killed the
	// sandbox's user processes because its host memory neared the limit
	// (gVisor: internal/runtime/runsc/guard.go).
	GuardKills uint64
}

// LimitReporter is implemented by drivers that can tell when a sandbox hit
// its limits. The manager type-asserts it to explain denials.
type LimitReporter interface {
	LimitCounters(ctx context.Context, id string) (LimitCounters, error)
}
