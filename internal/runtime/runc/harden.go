package runc

import (
	"path/filepath"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/agentbox/agentbox/internal/seccomprules"
)

// harden adds the container tier's own hardening to a bundle's spec: the
// seccomp filter (gVisor's sentry filters its own host syscalls instead)
// and fewer capabilities. It also points the spec at the bundle's CRIU
// configuration (setCRIUConf), so a new bundle's config.json is written
// once.
func (d *Driver) harden(s *specs.Spec) {
	setCRIUAnnotation(s, filepath.Dir(s.Root.Path))
	s.Linux.Seccomp = seccomprules.Profile()
	// Raw and packet sockets would let the sandbox forge frames on the
	// bridge (ARP spoofing a neighbour); device nodes are refused by the
	// device cgroup anyway. gVisor has neither (no --net-raw).
	c := s.Process.Capabilities
	c.Bounding, c.Effective, c.Permitted = dropCaps(c.Bounding), dropCaps(c.Effective), dropCaps(c.Permitted)
	if nrs := d.auditSyscalls; nrs != "" && d.b.UserNS() {
		// envd stacks a logging copy of the refusals (runc 1.1 cannot
		// set the log flag on its filter), which needs CAP_SYS_ADMIN in
		// the sandbox's user namespace; it drops it before anything
		// else runs (internal/envd/auditfilter_linux.go).
		c.Bounding, c.Effective, c.Permitted = append(c.Bounding, "CAP_SYS_ADMIN"), append(c.Effective, "CAP_SYS_ADMIN"), append(c.Permitted, "CAP_SYS_ADMIN")
		s.Process.Args = append(s.Process.Args, "--audit-syscalls", nrs)
	}
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

// reserveForEnvd sets up the user cgroup of sandbox id, which keeps envd a
// reserve of pids and memory (bundle/usercgroup.go). A sandbox without one
// still runs, with envd sharing its limits with the user's processes.
func (d *Driver) reserveForEnvd(id string) {
	if err := d.b.SetupUserCgroup(id); err != nil {
		d.log.Warn("envd keeps no reserve of pids and memory: commands share the sandbox's limits with it", "id", id, "err", err)
	}
}
