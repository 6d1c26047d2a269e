package bundle

import (
	"fmt"
	"path/filepath"

	"github.com/agentbox/agentbox/internal/runtime"
)

// LimitCounters reads the OOM-kill and refused-fork counters of the
// sandbox's cgroup (cgroup v1: memory.oom_control, pids.events; v2:
// memory.events, pids.events).
func (s *Store) LimitCounters(id string) (runtime.LimitCounters, error) {
	if err := CheckID(id); err != nil {
		return runtime.LimitCounters{}, err
	}
	cg := s.BundleCgroupPath(id)
	var c runtime.LimitCounters
	var err error
	if s.cgroupV2 {
		dir := filepath.Join(cgroupRoot, cg)
		c.OOMKills, err = statField(filepath.Join(dir, "memory.events"), "oom_kill")
		c.PIDsMax, _ = statField(filepath.Join(dir, "pids.events"), "max")
	} else {
		c.OOMKills, err = statField(filepath.Join(cgroupRoot, "memory", cg, "memory.oom_control"), "oom_kill")
		c.PIDsMax, _ = statField(filepath.Join(cgroupRoot, "pids", cg, "pids.events"), "max")
	}
	if err != nil {
		return c, fmt.Errorf("sandbox %s limit counters: %w", id, err)
	}
	// A limit hit in the user cgroup (usercgroup.go) is counted there.
	// (v2's memory.events counts the subtree already.)
	var oom, pids uint64
	if s.cgroupV2 {
		pids, _ = statField(filepath.Join(cgroupRoot, cg, UserCgroup, "pids.events"), "max")
	} else {
		oom, _ = statField(filepath.Join(cgroupRoot, "memory", cg, UserCgroup, "memory.oom_control"), "oom_kill")
		pids, _ = statField(filepath.Join(cgroupRoot, "pids", cg, UserCgroup, "pids.events"), "max")
	}
	c.OOMKills += oom
	c.PIDsMax += pids
	return c, nil
}
