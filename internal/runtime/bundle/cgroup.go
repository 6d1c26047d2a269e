package bundle

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/runtime"
)

const cgroupRoot = "/sys/fs/cgroup"

// IsCgroupV2 reports whether /sys/fs/cgroup is the unified hierarchy (v2
// only). Hybrid hosts (v1 controllers plus cgroup2 at unified/) count as v1.
func IsCgroupV2() bool {
	var st unix.Statfs_t
	return unix.Statfs(cgroupRoot, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
}

// CgroupPath is the cgroupsPath the OCI runtime gets: absolute, so it does not depend
// on which cgroup the server itself runs in.
// The directory is named by the sandbox's key: cgroupfs is world-listable.
func (s *Store) CgroupPath(id string) string {
	return "/" + filepath.Join(s.cfg.CgroupParent, s.key(id))
}

func readUint(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return 0, nil
	}
	return strconv.ParseUint(s, 10, 64)
}

// statField returns the value of key in a "key value" file (memory.stat).
func statField(path string, keys ...string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	vals := map[string]uint64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 {
			v, _ := strconv.ParseUint(f[1], 10, 64)
			vals[f[0]] = v
		}
	}
	for _, k := range keys {
		if v, ok := vals[k]; ok {
			return v, nil
		}
	}
	return 0, fmt.Errorf("%s: no %v", path, keys)
}

// cgroupStats fills the memory and CPU figures from the sandbox's cgroup.
func (s *Store) cgroupStats(cgPath string, st *runtime.Stats) error {
	var usage uint64
	var err error
	if s.cgroupV2 {
		dir := filepath.Join(cgroupRoot, cgPath)
		if usage, err = readUint(filepath.Join(dir, "memory.current")); err != nil {
			return err
		}
		st.MemoryCache, _ = statField(filepath.Join(dir, "memory.stat"), "file")
		st.MemoryLimit, _ = readUint(filepath.Join(dir, "memory.max"))
		usec, err := statField(filepath.Join(dir, "cpu.stat"), "usage_usec")
		if err != nil {
			return err
		}
		st.CPUUsageNanos = usec * 1000
	} else {
		mem := filepath.Join(cgroupRoot, "memory", cgPath)
		if usage, err = readUint(filepath.Join(mem, "memory.usage_in_bytes")); err != nil {
			return err
		}
		st.MemoryCache, _ = statField(filepath.Join(mem, "memory.stat"), "total_cache", "cache")
		st.MemoryLimit, _ = readUint(filepath.Join(mem, "memory.limit_in_bytes"))
		if st.CPUUsageNanos, err = readUint(filepath.Join(cgroupRoot, "cpuacct", cgPath, "cpuacct.usage")); err != nil {
			return err
		}
	}
	st.MemoryUsed = usage - min(usage, st.MemoryCache)
	return nil
}

// RemoveCgroups removes what the OCI runtime may have left of the sandbox's cgroup in
// every hierarchy (v1 controllers, the hybrid unified/ and name=systemd
// ones, or the single v2 tree). Cgroup directories go with rmdir only.
func (s *Store) RemoveCgroups(cgPath string) error {
	dirs := []string{filepath.Join(cgroupRoot, cgPath)}
	if !s.cgroupV2 {
		dirs = dirs[:0]
		entries, err := os.ReadDir(cgroupRoot)
		if err != nil {
			return err
		}
		seen := map[string]bool{}
		for _, e := range entries {
			// cpu and cpuacct are often symlinks to one cpu,cpuacct mount.
			real, err := filepath.EvalSymlinks(filepath.Join(cgroupRoot, e.Name()))
			if err != nil || seen[real] {
				continue
			}
			seen[real] = true
			dirs = append(dirs, filepath.Join(real, cgPath))
		}
	}
	var errs []error
	for _, d := range dirs {
		// The user cgroup (and on v2 envd's leaf) go first: a cgroup
		// with children cannot be removed.
		for _, child := range []string{UserCgroup, runtime.EnvdCgroup} {
			if err := unix.Rmdir(filepath.Join(d, child)); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("rmdir %s: %w", filepath.Join(d, child), err))
			}
		}
		if err := unix.Rmdir(d); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("rmdir %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

// BundleCgroupPath reads the cgroup path from the bundle, so a sandbox
// created under another CgroupParent is still found; it falls back to the
// configured one.
func (s *Store) BundleCgroupPath(id string) string {
	if oci, err := ReadSpec(s.Dir(id)); err == nil && oci.Linux != nil && oci.Linux.CgroupsPath != "" {
		return oci.Linux.CgroupsPath
	}
	return s.CgroupPath(id)
}
