package runc

import (
	"fmt"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/seccomprules"
)

// annotationTier records the sandbox's isolation tier in its bundle.
const annotationTier = "io.agentbox.tier"

// harden adds to the base spec what depends on the tier and the limits:
// the seccomp filter (runc; gVisor's sentry filters its own host syscalls
// and does not implement the refused ones for the sandbox), a size-limited
// /tmp, CPU shares proportional to the CPU count, and an OOM score that
// makes the host's OOM killer pick sandbox processes before the server.
func (r *Runtime) harden(s *specs.Spec, spec runtime.Spec) *specs.Spec {
	tier := spec.Runtime
	if tier == "" {
		tier = TierRunc
	}
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[annotationTier] = tier
	if tier == TierRunc {
		s.Linux.Seccomp = seccomprules.Profile()
		// Raw and packet sockets would let the sandbox forge frames on the
		// bridge (ARP spoofing a neighbour); device nodes are refused by the
		// device cgroup anyway. gVisor has neither (no --net-raw).
		c := s.Process.Capabilities
		c.Bounding, c.Effective, c.Permitted = dropCaps(c.Bounding), dropCaps(c.Effective), dropCaps(c.Permitted)
		if nrs := r.auditSyscalls; nrs != "" && r.usernsEnabled(tier) {
			// envd stacks a logging copy of the refusals (runc 1.1 cannot
			// set the log flag on its filter), which needs CAP_SYS_ADMIN in
			// the sandbox's user namespace; it drops it before anything
			// else runs (internal/envd/auditfilter_linux.go).
			c.Bounding, c.Effective, c.Permitted = append(c.Bounding, "CAP_SYS_ADMIN"), append(c.Effective, "CAP_SYS_ADMIN"), append(c.Permitted, "CAP_SYS_ADMIN")
			s.Process.Args = append(s.Process.Args, "--audit-syscalls", nrs)
		}
	}
	if mb := spec.Resources.TmpMB; mb > 0 {
		s.Mounts = append(s.Mounts, specs.Mount{
			Destination: "/tmp", Type: "tmpfs", Source: "tmpfs",
			Options: []string{"nosuid", "nodev", "mode=1777", fmt.Sprintf("size=%dm", mb)},
		})
	}
	if n := spec.Resources.CPUCount; n > 0 && s.Linux.Resources != nil && s.Linux.Resources.CPU != nil {
		s.Linux.Resources.CPU.Shares = ptr(uint64(1024 * n))
	}
	s.Linux.MaskedPaths = append(s.Linux.MaskedPaths, "/proc/kallsyms", "/sys/devices/virtual/powercap", "/sys/kernel")
	s.Process.OOMScoreAdj = ptr(500)
	return s
}

// dropCaps removes what from the base capability set on the runc tier.
func dropCaps(caps []string) []string {
	out := make([]string, 0, len(caps))
	for _, c := range caps {
		if c != "CAP_NET_RAW" && c != "CAP_MKNOD" {
			out = append(out, c)
		}
	}
	return out
}
