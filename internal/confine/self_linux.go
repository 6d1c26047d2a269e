package confine

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"unsafe"

	"github.com/landlock-lsm/go-landlock/landlock"
	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"
)

// A hook that is the server's own Go code (not a tool it execs) confines
// itself in two steps, because capabilities are per thread and a Go
// process has many: Prepare, on one locked thread, bounds the process
// (limits, Landlock, the capability bounding set) and re-execs the binary;
// the new process starts with only the kept capabilities on every thread,
// then Seal moves it into its directory and filters its syscalls.

// SelfJail is how Prepare and Seal confine a hook of the server's binary.
type SelfJail struct {
	// Writable is the only tree the hook may change (Landlock); Seal
	// makes it the hook's root. It is a path the hook can open (such as
	// FD(0)).
	Writable string
	// Keep are the capabilities the hook keeps (CAP_SYS_CHROOT is added
	// for Seal, which then refuses chroot).
	Keep []uintptr
	// Limits bound CPU, memory, file size and descriptors.
	Limits Limits
}

// Prepare confines the calling process as far as it can while it still
// execs itself, then execs argv (with the binary of the running process).
// It returns only on failure. The caller runs as root in new mount,
// network, IPC and UTS namespaces (Tool-like SysProcAttr).
func (j SelfJail) Prepare(argv []string) error {
	runtime.LockOSThread()
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("confine: private mounts: %w", err)
	}
	if err := setLimits(j.Limits); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("confine: own binary: %w", err)
	}
	if self, err = filepath.EvalSymlinks(self); err != nil {
		return fmt.Errorf("confine: own binary: %w", err)
	}
	rules := []landlock.Rule{
		landlock.PathAccess(landlock.AccessFSSet(ll.AccessFSExecute|ll.AccessFSReadFile|ll.AccessFSReadDir), systemDirs...).IgnoreIfMissing(),
		landlock.PathAccess(landlock.AccessFSSet(ll.AccessFSExecute|ll.AccessFSReadFile), self),
		landlock.RWDirs(j.Writable).WithRefer(),
	}
	// One ruleset for paths and scopes: every Landlock layer denies
	// linking or renaming across directories unless one of its own rules
	// grants "refer", so a second, scopes-only layer would refuse the
	// hard links an unpacked tree holds.
	jail := landlock.Config{HandledAccessFS: landlock.V7.HandledAccessFS, Scoped: landlock.V7.Scoped}
	if err := jail.BestEffort().Restrict(rules...); err != nil {
		return fmt.Errorf("confine: landlock: %w", err)
	}
	// No capability beyond the kept ones survives the exec: the bounding
	// set caps what root's exec grants, the inheritable and ambient sets
	// are emptied.
	keep := map[uintptr]bool{unix.CAP_SYS_CHROOT: true}
	for _, c := range j.Keep {
		keep[c] = true
	}
	for c := uintptr(0); c <= unix.CAP_LAST_CAP; c++ {
		if keep[c] {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, c, 0, 0, 0); err != nil {
			return fmt.Errorf("confine: drop capability %d: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("confine: ambient capabilities: %w", err)
	}
	var set [2]unix.CapUserData
	for c := range keep {
		set[c/32].Effective |= 1 << (c % 32)
		set[c/32].Permitted |= 1 << (c % 32)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	if err := unix.Capset(&hdr, &set[0]); err != nil {
		return fmt.Errorf("confine: capabilities: %w", err)
	}
	env := []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"}
	for _, k := range []string{"GOTRACEBACK", ProbeEnv} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return syscall.Exec(self, argv, env)
}

// ProbeEnv passes through the exec, for tests whose sealed side tries to
// leave instead of doing its work (the server never sets it).
const ProbeEnv = "AGENTBOX_CONFINE_PROBE"

// Seal, in the process Prepare exec'd, makes the directory open as dirFD
// the process's root (and closes dirFD), then refuses, on every thread,
// sockets, exec, ptrace, chroot and the calls the container tier refuses.
func (j SelfJail) Seal(dirFD int) error {
	if err := unix.Fchdir(dirFD); err != nil {
		return fmt.Errorf("confine: enter %s: %w", j.Writable, err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("confine: chroot: %w", err)
	}
	if err := unix.Close(dirFD); err != nil {
		return fmt.Errorf("confine: close the directory: %w", err)
	}
	prog, err := filterProg(false, unix.SYS_CHROOT)
	if err != nil {
		return err
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("confine: no_new_privs: %w", err)
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	if _, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog))); errno != 0 {
		return fmt.Errorf("confine: seccomp: %w", errno)
	}
	return nil
}

func setLimits(l Limits) error {
	for _, r := range []struct {
		res int
		val uint64
	}{
		{unix.RLIMIT_CPU, or(l.CPUSeconds, defaultCPUSeconds)},
		{unix.RLIMIT_AS, or(l.AddressSpace, defaultAddressSpace)},
		{unix.RLIMIT_NOFILE, or(l.Files, defaultFiles)},
		{unix.RLIMIT_CORE, 0},
		{unix.RLIMIT_FSIZE, or(l.FileSize, unix.RLIM_INFINITY)},
	} {
		if err := unix.Setrlimit(r.res, &unix.Rlimit{Cur: r.val, Max: r.val}); err != nil {
			return fmt.Errorf("confine: rlimit %d: %w", r.res, err)
		}
	}
	return nil
}
