package microvm

import (
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

// cgroupDirs are sandbox id's cgroup directories by controller ("" on v2),
// named by its host key: cgroupfs is world-listable.
func (d *Driver) cgroupDirs(id string) map[string]string {
	rel := filepath.Join(d.cfg.CgroupParent, "microvm-"+d.keys.Key(id))
	if d.cgroupV2 {
		return map[string]string{"": filepath.Join(cgroupRoot, rel)}
	}
	dirs := map[string]string{}
	for _, c := range []string{"memory", "cpu", "cpuacct", "pids"} {
		dirs[c] = filepath.Join(cgroupRoot, c, rel)
	}
	return dirs
}

// limit moves QEMU (pid) into a cgroup of its own holding the sandbox's
// limits: guest RAM plus QEMU's own overhead, CPUs, and a task cap
// (QEMU's threads).
func (d *Driver) limit(spec runtime.Spec, pid int) error {
	mem := strconv.FormatInt(int64(memoryMB(spec)+qemuOverheadMB)<<20, 10)
	cpus := spec.Resources.CPUCount
	files := map[string]string{}
	v2 := d.cgroupV2
	if v2 {
		files["memory.max"], files["memory.swap.max"], files["pids.max"] = mem, "0", "512"
		if cpus > 0 {
			files["cpu.max"] = fmt.Sprintf("%d 100000", cpus*100000)
		}
	} else {
		files["memory/memory.limit_in_bytes"], files["pids/pids.max"] = mem, "512"
		if cpus > 0 {
			files["cpu/cpu.cfs_period_us"], files["cpu/cpu.cfs_quota_us"] = "100000", strconv.Itoa(cpus*100000)
		}
	}
	dirs := d.cgroupDirs(spec.ID)
	for _, dir := range dirs {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	if v2 {
		parent := filepath.Dir(dirs[""])
		_ = os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), []byte("+memory +cpu +pids"), 0o644)
	}
	for name, v := range files {
		ctrl, file := "", name
		if !v2 {
			ctrl, file, _ = strings.Cut(name, "/")
		}
		if err := os.WriteFile(filepath.Join(dirs[ctrl], file), []byte(v), 0o644); err != nil {
			return fmt.Errorf("cgroup %s: %w", name, err)
		}
	}
	for _, dir := range dirs {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
			return fmt.Errorf("move qemu into its cgroup: %w", err)
		}
	}
	return nil
}

// removeCgroups removes sandbox id's (empty) cgroups.
func (d *Driver) removeCgroups(id string) {
	for _, dir := range d.cgroupDirs(id) {
		if err := unix.Rmdir(dir); err != nil && !errors.Is(err, unix.ENOENT) {
			d.log.Warn("remove microvm cgroup", "dir", dir, "err", err)
		}
	}
}

// cgroupStats reads QEMU's memory and CPU use: the guest's RAM as QEMU
// touched it, plus QEMU itself.
func (d *Driver) cgroupStats(id string, st *runtime.Stats) {
	dirs := d.cgroupDirs(id)
	read := func(p string) uint64 {
		b, _ := os.ReadFile(p)
		n, _ := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		return n
	}
	if dir, ok := dirs[""]; ok {
		st.MemoryUsed, st.MemoryLimit = read(filepath.Join(dir, "memory.current")), read(filepath.Join(dir, "memory.max"))
		return
	}
	st.MemoryUsed = read(filepath.Join(dirs["memory"], "memory.usage_in_bytes"))
	st.MemoryLimit = read(filepath.Join(dirs["memory"], "memory.limit_in_bytes"))
	st.CPUUsageNanos = read(filepath.Join(dirs["cpuacct"], "cpuacct.usage"))
}
