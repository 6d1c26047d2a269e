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
	runtime.LockOSThread()
	if err := landlock.V7.BestEffort().RestrictPaths(rules...); err != nil {
		return fmt.Errorf("confine: landlock: %w", err)
	}
	if err := landlock.V7.BestEffort().RestrictScoped(); err != nil {
		return fmt.Errorf("confine: landlock scopes: %w", err)
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
	if err := installFilter(); err != nil {
		return err
	}
	env := []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"}
	return syscall.Exec(sp.Argv[0], sp.Argv, env)
}

func or(v, def uint64) uint64 {
	if v == 0 {
		return def
	}
	return v
}
