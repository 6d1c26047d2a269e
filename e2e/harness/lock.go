package harness

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// LockDir holds one lock file per instance name. Two `go test` runs of one
// package in one worktree derive the same instance (bridge, cgroups,
// nftables table); the lock makes the second refuse instead of tearing
// down the first one's host state.
const LockDir = "/run/agentbox-e2e"

// instanceLock is the held lock of one instance name.
type instanceLock struct{ f *os.File }

// lockInstance takes the lock of instance under dir, or says who holds it.
// The kernel drops it when the holding process dies, so a crashed run never
// leaves a stale lock.
func lockInstance(dir, instance string) (*instanceLock, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("lock dir %s: %w", dir, err)
	}
	path := filepath.Join(dir, instance+".lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("instance %s is in use by another test run (%s; lock %s): two runs of one e2e package in one worktree share a bridge, cgroups and an nftables table; wait for that run to end, or run this one from another worktree",
				instance, holderOf(holder), path)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	// Who holds it, for the message of the run that finds it taken.
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(fmt.Sprintf("pid %d: %s\n", os.Getpid(), strings.Join(os.Args, " "))), 0)
	return &instanceLock{f: f}, nil
}

func holderOf(b []byte) string {
	if s := strings.TrimSpace(string(b)); s != "" {
		return "held by " + s
	}
	return "holder unknown"
}

// release drops the lock (the file stays, empty of meaning once unlocked).
func (l *instanceLock) release() {
	if l == nil || l.f == nil {
		return
	}
	_ = unix.Flock(int(l.f.Fd()), unix.LOCK_UN)
	_ = l.f.Close()
	l.f = nil
}
