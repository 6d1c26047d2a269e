package bundle

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
)

// Every sandbox's cgroup sits under one parent (Config.CgroupParent) with
// a fixed CPU weight: half the server's (`agentbox serve` puts itself in a
// cgroup of its own weighing twice as much, cmd/agentbox/serve.go), so that
// however many sandboxes spin, fork or thrash, the server keeps two thirds
// of a contended CPU; below the parent, sandboxes share equally for equal
// sizes (cpu.shares 1024 per CPU, see harden.go). Both weigh more than a
// default host task (1024 on v1, 100 on v2): the host is there to run them.
const (
	ParentCPUSharesV1 = 2048
	ParentCPUWeightV2 = 200
)

// setupCgroupParent creates the parent cgroup and sets its CPU weight. On
// v2 a host without the cpu controller delegated at the root keeps the
// default weight (and a warning says so).
func (s *Store) setupCgroupParent() error {
	file, value := filepath.Join(cgroupRoot, "cpu", s.cfg.CgroupParent, "cpu.shares"), ParentCPUSharesV1
	if s.cgroupV2 {
		file, value = filepath.Join(cgroupRoot, s.cfg.CgroupParent, "cpu.weight"), ParentCPUWeightV2
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return fmt.Errorf("sandbox cgroup parent: %w", err)
	}
	err := os.WriteFile(file, []byte(strconv.Itoa(value)), 0o644)
	if s.cgroupV2 && errors.Is(err, fs.ErrNotExist) {
		s.log.Warn("the cpu controller is not enabled for the sandboxes' parent cgroup; sandboxes compete with the server at the default weight", "cgroup", filepath.Dir(file))
		return nil
	}
	if err != nil {
		return fmt.Errorf("sandbox cgroup parent: set CPU weight: %w", err)
	}
	return nil
}
