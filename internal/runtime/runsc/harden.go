package runsc

import (
	"slices"
	"strconv"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/agentbox/agentbox/internal/runtime/bundle"
)

// options are the bundle options of this tier's sandboxes.
func options() bundle.Options {
	return bundle.Options{Tier: Name, Harden: harden}
}

// harden gives envd its reserve of pids and memory inside the sentry. The
// host's cgroup holds the whole sandbox (sentry, gofer, every task's stub),
// and the cgroups its tasks see are the sentry's own (runsc's cgroupfs),
// which the server cannot reach: envd makes the user cgroup there itself,
// with the limits the server computes (--user-pids, --user-memory), on a
// cgroup mount writable inside (the sentry's cgroupfs, never the host's).
// The sentry refuses a fork past pids.max (EAGAIN) but not every one under
// a fork bomb's concurrent forks (the user cgroup counted 525 tasks at a
// limit of 300), and its memory limit is not enforced (the host cgroup's
// is, on the whole sandbox). With the systrap platform every address space
// has a stub process on the host, a host pid and a few hundred KiB of the
// host cgroup's memory, which stay after many tasks have ended and been
// reaped: the host cost follows the peak of tasks, not their count now. A
// fork bomb in gVisor would reach the host cgroup's memory limit, and the
// host's OOM killer would end the sentry, and the sandbox with it: the
// server's host memory guard (guard.go) kills the bomb first. A lower host
// pids limit does not help: the sentry's own threads share it, and a
// sentry that cannot make one ends (Go's newosproc).
func harden(s *specs.Spec) {
	var pidsLimit, memLimit int64
	if r := s.Linux.Resources; r != nil {
		if r.Pids != nil && r.Pids.Limit != nil {
			pidsLimit = *r.Pids.Limit
		}
		if r.Memory != nil && r.Memory.Limit != nil {
			memLimit = *r.Memory.Limit
		}
	}
	pids, mem := bundle.UserLimits(pidsLimit, memLimit)
	if pids <= 0 {
		return
	}
	for i, m := range s.Mounts {
		if m.Destination == "/sys/fs/cgroup" {
			s.Mounts[i].Options = slices.DeleteFunc(slices.Clone(m.Options), func(o string) bool { return o == "ro" })
		}
	}
	s.Process.Args = append(s.Process.Args, "--user-pids", strconv.FormatInt(pids, 10))
	if mem > 0 {
		s.Process.Args = append(s.Process.Args, "--user-memory", strconv.FormatInt(mem, 10))
	}
}
