package localrun

import (
	"errors"
	"fmt"
	"os"

	"github.com/landlock-lsm/go-landlock/landlock"
	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
)

// LandlockABI returns the kernel's Landlock ABI version, or an error
// saying why Landlock is not available.
func LandlockABI() (int, error) {
	v, err := ll.LandlockGetABIVersion()
	if err != nil {
		return 0, fmt.Errorf("Landlock is not available on this kernel (%w); it needs Linux 5.13+ with CONFIG_SECURITY_LANDLOCK and \"landlock\" in the lsm= boot parameter", err)
	}
	return v, nil
}

const (
	readAccess = landlock.AccessFSSet(ll.AccessFSExecute | ll.AccessFSReadFile | ll.AccessFSReadDir)
	listAccess = landlock.AccessFSSet(ll.AccessFSReadDir)
	fileAccess = landlock.AccessFSSet(ll.AccessFSExecute | ll.AccessFSReadFile | ll.AccessFSWriteFile | ll.AccessFSTruncate | ll.AccessFSIoctlDev)
)

// splitDirs separates directories from other files (which include
// devices and sockets); paths that vanished are dropped.
func splitDirs(paths []string) (dirs, files []string) {
	for _, p := range paths {
		fi, err := os.Stat(p)
		switch {
		case err != nil:
		case fi.IsDir():
			dirs = append(dirs, p)
		default:
			files = append(files, p)
		}
	}
	return dirs, files
}

// applyLandlock restricts the calling process (all threads) and its future
// children to the plan, with the best ABI the kernel has: at most V7 here,
// whose rights go-landlock downgrades on older kernels.
func applyLandlock(p Plan) error {
	if len(p.Read) == 0 && len(p.Listable) == 0 && len(p.Write) == 0 {
		return errors.New("landlock: empty plan")
	}
	// Directory rights on a file make the kernel refuse the rule.
	readDirs, readFiles := splitDirs(p.Read)
	writeDirs, writeFiles := splitDirs(p.Write)
	rules := []landlock.Rule{
		landlock.PathAccess(readAccess, readDirs...).IgnoreIfMissing(),
		landlock.PathAccess(readAccess&fileAccess, readFiles...).IgnoreIfMissing(),
		landlock.PathAccess(listAccess, p.Listable...).IgnoreIfMissing(),
		landlock.RWDirs(writeDirs...).WithIoctlDev().WithRefer().IgnoreIfMissing(),
		landlock.RWFiles(writeFiles...).WithIoctlDev().IgnoreIfMissing(),
	}
	cfg := landlock.V7.BestEffort()
	if err := cfg.RestrictPaths(rules...); err != nil {
		return fmt.Errorf("landlock: %w", err)
	}
	// Signals and abstract unix sockets stay inside the sandbox: the
	// command cannot kill or talk to the user's other processes that way.
	if err := cfg.RestrictScoped(); err != nil {
		return fmt.Errorf("landlock scopes: %w", err)
	}
	return nil
}
