package envd

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	agentruntime "github.com/agentbox/agentbox/internal/runtime"
)

// envd keeps a reserve of the sandbox's pids and memory: what it starts for
// the user starts in the user cgroup, a child of the sandbox's with lower
// limits that the server sets up (internal/runtime/bundle/usercgroup.go).
// envd and the reapers stay outside it, so a fork bomb or a memory thrash
// fills the user cgroup and leaves envd room to answer, kill and start the
// next command. Every command and terminal starts through a reaper
// (reaper_linux.go) and the template's start command through
// startTemplateCommand: those two places call startInUserCgroup. Without a
// user cgroup (no user namespace, an older server) the
// process starts where envd is.

// cgroupMount is where the sandbox's cgroups are mounted (as their root,
// in the sandbox's cgroup namespace).
const cgroupMount = "/sys/fs/cgroup"

// userCgroup says where the user cgroup is: the v2 directory, or the v1
// "tasks" files of each hierarchy that has one (pids, memory, cpu).
type userCgroup struct {
	v2    string
	tasks []string
}

// findUserCgroup looks for the user cgroup under root (cgroupMount).
func findUserCgroup(root string) userCgroup {
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err == nil {
		dir := filepath.Join(root, agentruntime.UserCgroup)
		if _, err := os.Stat(filepath.Join(dir, "cgroup.procs")); err == nil {
			return userCgroup{v2: dir}
		}
		return userCgroup{}
	}
	var cg userCgroup
	for _, ctrl := range []string{"pids", "memory", "cpu"} {
		p := filepath.Join(root, ctrl, agentruntime.UserCgroup, "tasks")
		if _, err := os.Stat(p); err == nil {
			cg.tasks = append(cg.tasks, p)
		}
	}
	return cg
}

// fullMargin is how close to its pids limit the user cgroup may be before
// a new command starts in the reserve instead: a command that squeezes
// into the last free pid of a cgroup a fork bomb holds starts, and then
// cannot fork anything (not even its login shell's first subshell).
const fullMargin = 16

// userCgroupFull says whether the user cgroup under root is within
// fullMargin pids of its limit (false when it has no pids limit or cannot
// be read).
func userCgroupFull(root string) bool {
	dir := filepath.Join(root, "pids", agentruntime.UserCgroup)
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err == nil {
		dir = filepath.Join(root, agentruntime.UserCgroup)
	}
	read := func(name string) (int64, bool) {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return 0, false
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		return n, err == nil
	}
	limit, ok := read("pids.max") // "max" (no limit) does not parse
	if !ok {
		return false
	}
	cur, ok := read("pids.current")
	return ok && cur >= limit-fullMargin
}

// startInUserCgroup calls start, which forks one process with sys (or with
// the SysProcAttr it was configured with, sys then being that one), so that
// the process starts in the user cgroup when there is one. On v2 the
// process is cloned into it (CLONE_INTO_CGROUP). On v1, where a thread can
// be in a cgroup of its own, the forking thread joins the user cgroup first,
// so its child starts there, and then ends with its goroutine: nothing of
// envd or of the reaper stays in the user cgroup. A user cgroup that cannot
// be joined starts the process where the caller is, as with none.
func startInUserCgroup(root string, sys *syscall.SysProcAttr, start func() error) error {
	cg := findUserCgroup(root)
	switch {
	case cg.v2 != "" && sys != nil:
		fd, err := unix.Open(cg.v2, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return start()
		}
		defer unix.Close(fd)
		sys.UseCgroupFD, sys.CgroupFD = true, fd
		err = start()
		sys.UseCgroupFD, sys.CgroupFD = false, 0
		if errors.Is(err, unix.EBUSY) || errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
			return start()
		}
		return err
	case len(cg.tasks) > 0:
		done := make(chan error, 1)
		go func() {
			runtime.LockOSThread()
			// Never unlocked: the thread ends with this goroutine.
			tid := []byte(strconv.Itoa(unix.Gettid()))
			for _, p := range cg.tasks {
				if err := os.WriteFile(p, tid, 0); err != nil && !errors.Is(err, fs.ErrNotExist) {
					break // the child starts in the cgroups joined so far
				}
			}
			done <- start()
		}()
		return <-done
	}
	return start()
}

// MakeUserCgroup makes the user cgroup itself, with at most pids tasks and
// memBytes of memory (0: no limit of its own), where the sandbox's cgroups
// are the sandbox kernel's own (gVisor's sentry: the host's cgroup holds
// the whole sandbox and the server cannot reach the cgroups inside). One
// that exists already (a restored sandbox) keeps its limits.
func MakeUserCgroup(pids, memBytes int64) error {
	for _, f := range []struct {
		ctrl, file string
		value      int64
	}{{"pids", "pids.max", pids}, {"memory", "memory.limit_in_bytes", memBytes}} {
		dir := filepath.Join(cgroupMount, f.ctrl, agentruntime.UserCgroup)
		if err := os.Mkdir(dir, 0o755); errors.Is(err, fs.ErrExist) {
			continue
		} else if err != nil {
			return err
		}
		if f.value > 0 {
			if err := os.WriteFile(filepath.Join(dir, f.file), []byte(strconv.FormatInt(f.value, 10)), 0); err != nil {
				return err
			}
		}
	}
	return nil
}
