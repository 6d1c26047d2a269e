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
	return c, nil
}
