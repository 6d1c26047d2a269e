package confine

import (
	"encoding/json"
	"fmt"
	"runtime"
	"syscall"

	"github.com/landlock-lsm/go-landlock/landlock"
	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"
)

// systemDirs hold the tools, their libraries and configuration: readable
// (and executable), never writable.
var systemDirs = []string{"/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc", "/proc"}

// RunHook is the child's side (`agentbox __hook confine <spec>`), started
// as root in its new namespaces: it limits itself, keeps the file system
// to the system dirs and the passed files, drops to the tool's uid, filters
// its syscalls and execs the tool. It returns only on failure.
func RunHook(arg string) error {
	var sp spec
	if err := json.Unmarshal([]byte(arg), &sp); err != nil {
		return fmt.Errorf("%w: %w", errBadSpec, err)
	}
	if len(sp.Argv) == 0 || sp.UID <= 0 || sp.GID <= 0 {
		return fmt.Errorf("%w: no tool or a privileged uid", errBadSpec)
	}
	// Mounts made here (none) and the host's stay apart.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("confine: private mounts: %w", err)
	}
	if err := setLimits(sp.Limits); err != nil {
		return err
	}
	// The rules are made as root (the passed files' dirs are root's), and
	// hold for the tool after the drop.
	rules := []landlock.Rule{
		landlock.PathAccess(landlock.AccessFSSet(ll.AccessFSExecute|ll.AccessFSReadFile|ll.AccessFSReadDir), systemDirs...).IgnoreIfMissing(),
		landlock.RWFiles("/dev/null").WithIoctlDev(),
	}
	for i := range sp.Files {
		rules = append(rules, landlock.RWFiles(FD(i)))
	}
	for i := range sp.Dirs {
		rules = append(rules, landlock.PathAccess(landlock.AccessFSSet(ll.AccessFSReadFile|ll.AccessFSReadDir), FD(sp.Files+i)))
	}
	runtime.LockOSThread()
	// One layer for paths and scopes, as SelfJail's: a second layer adds
	// nothing the first cannot say, and each layer is one more ruleset the
	// kernel checks on every access.
	jail := landlock.Config{HandledAccessFS: landlock.V7.HandledAccessFS, Scoped: landlock.V7.Scoped}
	if err := jail.BestEffort().Restrict(rules...); err != nil {
		return fmt.Errorf("confine: landlock: %w", err)
	}
	// A tree copier keeps its one capability through the uid change.
	if sp.ReadAll {
		if err := unix.Prctl(unix.PR_SET_KEEPCAPS, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("confine: keep capabilities: %w", err)
		}
	}
	// setgroups, then gid, then uid: root's capabilities go with the uid.
	if err := syscall.Setgroups(nil); err != nil {
		return fmt.Errorf("confine: setgroups: %w", err)
	}
	if err := syscall.Setresgid(sp.GID, sp.GID, sp.GID); err != nil {
		return fmt.Errorf("confine: setgid: %w", err)
	}
	if err := syscall.Setresuid(sp.UID, sp.UID, sp.UID); err != nil {
		return fmt.Errorf("confine: setuid: %w", err)
	}
	if sp.ReadAll {
		if err := keepReadAll(); err != nil {
			return err
		}
	}
	if err := installFilter(); err != nil {
		return err
	}
	env := []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"}
	return syscall.Exec(sp.Argv[0], sp.Argv, env)
}

// keepReadAll, on the locked thread after the uid change, leaves
// CAP_DAC_READ_SEARCH as the only capability, ambient so that the tool
// (no file capabilities, no set-id) holds it after the exec.
func keepReadAll() error {
	const c = unix.CAP_DAC_READ_SEARCH
	var set [2]unix.CapUserData
	set[c/32].Effective = 1 << (c % 32)
	set[c/32].Permitted = 1 << (c % 32)
	set[c/32].Inheritable = 1 << (c % 32)
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	if err := unix.Capset(&hdr, &set[0]); err != nil {
		return fmt.Errorf("confine: capabilities: %w", err)
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_RAISE, c, 0, 0); err != nil {
		return fmt.Errorf("confine: ambient capability: %w", err)
	}
	return nil
}

func or(v, def uint64) uint64 {
	if v == 0 {
		return def
	}
	return v
}
