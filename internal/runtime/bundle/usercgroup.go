package bundle

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/runtime"
)

// A sandbox's control plane must outlive its workload: after a fork bomb or
// a memory thrash its owner still runs `kill` or a new command. So envd
// keeps a reserve of the sandbox's pids and memory. Everything envd starts
// for the user (commands, terminals, the template's start command and the
// kernels it runs) lives in a child cgroup, "user", whose limits are the
// sandbox's minus the reserve; envd and the reapers that supervise commands
// stay in the sandbox's cgroup, where only the reserve is left when the user
// cgroup is full. An OOM in the user cgroup kills a user process, never envd.
// The user cgroup is one CPU scheduling entity too (cpu controller, default
// weight): thousands of runaway tasks weigh as much as envd's, not
// thousands of times more.
//
// The server creates the child (it owns the cgroup) and gives its
// membership files (cgroup.procs and tasks; no limit) to the sandbox's root,
// so envd's reaper can put a command there from inside (the sandbox's
// /sys/fs/cgroup is mounted read-write for that, in its user namespace
// only: every other cgroup file stays the host's, which the sandbox's root
// cannot write). What envd can do there, sandbox root can too: on v1 move
// any of its processes into the user cgroup (envd included), on v2 move
// them between the user and envd leaves. The reserve guards the owner
// against runaway code (a fork bomb, a leak), not against code that sets
// out to spend the reserve; the sandbox's own limits hold either way.

// UserCgroup is the name of the user processes' child cgroup.
const UserCgroup = runtime.UserCgroup

// Reserve figures: a share of the sandbox's limit, at least the minimum and
// at most the maximum, never more than half the limit.
const (
	pidsReserveMin = 64
	pidsReserveMax = 512
	memReserveMin  = 32 << 20
	memReserveMax  = 256 << 20
)

// reserve returns the part of limit kept for envd: limit/8 within [lo, hi],
// at most limit/2.
func reserve(limit, lo, hi int64) int64 {
	return min(max(limit/8, lo), hi, limit/2)
}

// UserLimits are the limits of the user cgroup of a sandbox limited to
// pids tasks and memBytes of memory: 0 means no limit of its own (the
// sandbox's applies).
func UserLimits(pids, memBytes int64) (userPIDs, userMem int64) {
	if pids > 0 {
		userPIDs = pids - reserve(pids, pidsReserveMin, pidsReserveMax)
	}
	if memBytes > 0 {
		userMem = memBytes - reserve(memBytes, memReserveMin, memReserveMax)
	}
	return userPIDs, userMem
}

// userCgroupFile is one file written in the user cgroup: a limit, or
// (chown) a membership file handed to the sandbox's root.
type userCgroupFile struct {
	name, value string
	chown       bool
}

// SetupUserCgroup creates (or completes, after a restore) the user cgroup
// of sandbox id from its bundle's config.json: below its cgroup, with the
// limits its own leave after the reserve, its membership files owned by the
// sandbox's root. Only a sandbox in a user namespace gets one (its root is
// not the host's, so the read-write cgroup mount gives it nothing else); on
// v1 it lives in the pids, memory and cpu hierarchies, on v2 in the single tree
// (see setupUserCgroupV2, which needs the sandbox's init started).
func (s *Store) SetupUserCgroup(id string) error {
	oci, err := ReadSpec(s.Dir(id))
	if err != nil {
		return fmt.Errorf("sandbox %s: user cgroup: %w", id, err)
	}
	if oci.Linux == nil || len(oci.Linux.UIDMappings) == 0 || oci.Linux.CgroupsPath == "" {
		return nil
	}
	var rootUID uint32
	for _, m := range oci.Linux.UIDMappings {
		if m.ContainerID == 0 {
			rootUID = m.HostID
		}
	}
	var pidsLimit, memLimit int64
	if r := oci.Linux.Resources; r != nil {
		if r.Pids != nil && r.Pids.Limit != nil {
			pidsLimit = *r.Pids.Limit
		}
		if r.Memory != nil && r.Memory.Limit != nil {
			memLimit = *r.Memory.Limit
		}
	}
	pids, mem := UserLimits(pidsLimit, memLimit)
	if s.cgroupV2 {
		err = setupUserCgroupV2(oci.Linux.CgroupsPath, pids, mem, rootUID)
	} else {
		err = setupUserCgroupV1(oci.Linux.CgroupsPath, pids, mem, rootUID)
	}
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	return nil
}

func setupUserCgroupV1(cgPath string, pids, mem int64, rootUID uint32) error {
	procs := []userCgroupFile{{name: "cgroup.procs", chown: true}, {name: "tasks", chown: true}}
	pidsFiles := procs
	if pids > 0 {
		pidsFiles = append([]userCgroupFile{{name: "pids.max", value: strconv.FormatInt(pids, 10)}}, procs...)
	}
	memFiles := procs
	if mem > 0 {
		v := strconv.FormatInt(mem, 10)
		// memsw (memory+swap) must stay at or above the memory limit: set
		// the memory limit first; a kernel without swap accounting has no
		// memsw file.
		memFiles = append([]userCgroupFile{{name: "memory.limit_in_bytes", value: v}, {name: "memory.memsw.limit_in_bytes", value: v}}, procs...)
	}
	for _, c := range []struct {
		ctrl  string
		files []userCgroupFile
	}{{"pids", pidsFiles}, {"memory", memFiles}, {"cpu", procs}} {
		if err := writeUserCgroup(filepath.Join(cgroupRoot, c.ctrl, cgPath, UserCgroup), c.files, rootUID); err != nil {
			return fmt.Errorf("user cgroup (%s): %w", c.ctrl, err)
		}
	}
	return nil
}

// writeUserCgroup makes dir and writes files in it.
func writeUserCgroup(dir string, files []userCgroupFile, rootUID uint32) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, f := range files {
		p := filepath.Join(dir, f.name)
		if f.chown {
			if err := os.Chown(p, int(rootUID), int(rootUID)); err != nil {
				return err
			}
			continue
		}
		err := os.WriteFile(p, []byte(f.value), 0o644)
		if errors.Is(err, fs.ErrNotExist) && f.name == "memory.memsw.limit_in_bytes" {
			continue
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// setupUserCgroupV2: on the unified hierarchy a cgroup with processes
// cannot have children with controllers ("no internal processes"), so envd
// cannot stay in the sandbox's own cgroup next to the user one. The server
// makes the sandbox's cgroup a parent of two leaves: "envd" (the OCI
// runtime's init, moved there) and "user", with pids and memory enabled for
// both; moving a command between the two needs write access to the
// parent's cgroup.procs, which is given to the sandbox's root with the
// leaves'.
func setupUserCgroupV2(cgPath string, pids, mem int64, rootUID uint32) error {
	parent := filepath.Join(cgroupRoot, cgPath)
	envdDir := filepath.Join(parent, runtime.EnvdCgroup)
	if err := os.MkdirAll(envdDir, 0o755); err != nil {
		return fmt.Errorf("user cgroup: %w", err)
	}
	// Everything already in the sandbox's cgroup (envd, once the runtime
	// started it) moves to the envd leaf before controllers are enabled.
	if err := moveProcs(parent, envdDir); err != nil {
		return fmt.Errorf("user cgroup: %w", err)
	}
	if err := os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), []byte("+pids +memory"), 0o644); err != nil {
		return fmt.Errorf("user cgroup: enable pids and memory: %w", err)
	}
	// Where the cpu controller is delegated, the two leaves share the
	// sandbox's CPU equally when both are busy.
	_ = os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), []byte("+cpu"), 0o644)
	files := []userCgroupFile{{name: "cgroup.procs", chown: true}}
	if pids > 0 {
		files = append(files, userCgroupFile{name: "pids.max", value: strconv.FormatInt(pids, 10)})
	}
	if mem > 0 {
		files = append(files, userCgroupFile{name: "memory.max", value: strconv.FormatInt(mem, 10)})
	}
	if err := writeUserCgroup(filepath.Join(parent, UserCgroup), files, rootUID); err != nil {
		return fmt.Errorf("user cgroup: %w", err)
	}
	for _, d := range []string{envdDir, parent} {
		if err := os.Chown(filepath.Join(d, "cgroup.procs"), int(rootUID), int(rootUID)); err != nil {
			return fmt.Errorf("user cgroup: %w", err)
		}
	}
	return nil
}

// moveProcs moves every process of cgroup v2 dir from into to.
func moveProcs(from, to string) error {
	b, err := os.ReadFile(filepath.Join(from, "cgroup.procs"))
	if err != nil {
		return err
	}
	for _, f := range strings.Fields(string(b)) {
		if err := os.WriteFile(filepath.Join(to, "cgroup.procs"), []byte(f), 0o644); err != nil && !errors.Is(err, unix.ESRCH) {
			return err
		}
	}
	return nil
}
