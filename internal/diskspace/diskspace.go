// Package diskspace keeps the server's disks from filling up: work that
// grows a disk (a create, a build, an upload, a snapshot, a volume) is
// refused with errdefs.ErrNoSpace while the disk's free space is under a
// reserve, so the space left is always enough to record state (SQLite
// needs room for its journal) and to delete things. A reserve file on each
// disk holds part of that room against writers the server does not admit
// (sandbox disks, logs): it is released when the disk runs out and made
// again once there is room.
package diskspace

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// ReserveFile is the name of the reserve file in each disk's directory.
const ReserveFile = ".space-reserve"

// Disk is one directory the server writes to, on its own filesystem or not.
type Disk struct {
	Name   string // what users call it: "data disk (--data-dir)"
	Dir    string
	ToFree string // what an operator deletes to make room
}

// Guard admits disk-growing work. A nil *Guard admits everything.
type Guard struct {
	disks   []Disk
	reserve uint64 // bytes that must stay free after admission
	file    uint64 // bytes held by each disk's reserve file

	mu       sync.Mutex
	released map[string]bool // by Dir: its reserve file is given back
}

// New guards disks with a reserve of reserveMB MiB each; a quarter of it
// (at most 64 MiB) is held in a reserve file. Disks on the same filesystem are checked once
// each, which costs a statfs.
func New(reserveMB int, disks ...Disk) (*Guard, error) {
	if reserveMB <= 0 {
		return nil, nil
	}
	g := &Guard{reserve: uint64(reserveMB) << 20, file: min(uint64(reserveMB)<<20/4, 64<<20), released: map[string]bool{}}
	seen := map[uint64]bool{}
	for _, d := range disks {
		var st unix.Stat_t
		if err := unix.Stat(d.Dir, &st); err != nil {
			return nil, fmt.Errorf("disk reserve: %s: %w", d.Name, err)
		}
		if seen[st.Dev] {
			continue // same filesystem: one reserve covers both
		}
		seen[st.Dev] = true
		g.disks = append(g.disks, d)
		if err := g.hold(d.Dir); err != nil {
			// Not fatal: a disk already full serves deletes, and the
			// reserve file is made once there is room.
			g.released[d.Dir] = true
		}
	}
	return g, nil
}

// Free returns the bytes an unprivileged writer can still use in dir.
func Free(dir string) (uint64, error) {
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return fs.Bavail * uint64(fs.Bsize), nil
}

// Admit returns nil when every disk has more than the reserve free, else
// an errdefs.ErrNoSpace naming the disk, what refused and what to free.
// what names the work ("create a sandbox").
func (g *Guard) Admit(what string) error {
	if g == nil {
		return nil
	}
	for _, d := range g.disks {
		free, err := Free(d.Dir)
		if err != nil {
			return nil // cannot tell: let the write itself decide
		}
		if free < g.reserve {
			if free < g.file {
				g.release(d.Dir) // the server's own writes need it now
			}
			return fmt.Errorf("cannot %s: the server's %s is full (%d MiB free, %d MiB are kept for recording state and deleting); free space by deleting %s, then retry: %w",
				what, d.Name, free>>20, g.reserve>>20, d.ToFree, errdefs.ErrNoSpace)
		}
		g.mu.Lock()
		again := g.released[d.Dir]
		g.mu.Unlock()
		if again && free >= g.reserve+g.file {
			if err := g.hold(d.Dir); err == nil {
				g.mu.Lock()
				delete(g.released, d.Dir)
				g.mu.Unlock()
			}
		}
	}
	return nil
}

// Release gives back every disk's reserve file (the server is about to
// write state on a disk that ran out).
func (g *Guard) Release() {
	if g == nil {
		return
	}
	for _, d := range g.disks {
		g.release(d.Dir)
	}
}

func (g *Guard) release(dir string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.released[dir] {
		return
	}
	if err := os.Remove(filepath.Join(dir, ReserveFile)); err == nil || errors.Is(err, os.ErrNotExist) {
		g.released[dir] = true
	}
}

// hold makes dir's reserve file with its blocks allocated (fallocate:
// a sparse file would hold nothing).
func (g *Guard) hold(dir string) error {
	if g.file == 0 {
		return nil
	}
	path := filepath.Join(dir, ReserveFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Fallocate(int(f.Fd()), 0, 0, int64(g.file)); err != nil {
		_ = os.Remove(path)
		return fmt.Errorf("reserve %d MiB in %s: %w", g.file>>20, dir, err)
	}
	return nil
}

// OutOfSpace reports whether err says a disk ran out of room: an ENOSPC
// or EDQUOT errno, or the text of one in the output of a tool the server
// ran (runc and CRIU report theirs as text).
func OutOfSpace(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
		return true
	}
	msg := strings.ToLower(err.Error())
	return strings.Contains(msg, strings.ToLower(unix.ENOSPC.Error())) || strings.Contains(msg, strings.ToLower(unix.EDQUOT.Error()))
}

// Explain turns err, the failure of work the guard admitted (what names
// it, as for Admit), into an errdefs.ErrNoSpace naming the disk and what to
// free when err says a disk ran out of room while the work wrote to it:
// the room above the reserve was smaller than the work. The disk named is
// the one with the least room left (the work's own partial files are
// usually removed by then, so none need be under the reserve). Other
// errors, and every error of a nil guard, are returned as they are.
func (g *Guard) Explain(what string, err error) error {
	if g == nil || len(g.disks) == 0 || !OutOfSpace(err) || errors.Is(err, errdefs.ErrNoSpace) {
		return err
	}
	var disk Disk
	least := uint64(0)
	for _, d := range g.disks {
		free, ferr := Free(d.Dir)
		if ferr == nil && (disk.Dir == "" || free < least) {
			disk, least = d, free
		}
	}
	if disk.Dir == "" {
		return err
	}
	return fmt.Errorf("cannot %s: the server's %s ran out of space before it was done (%d MiB free now, %d MiB of it kept for recording state and deleting); free space by deleting %s, then retry: %w",
		what, disk.Name, least>>20, g.reserve>>20, disk.ToFree, errdefs.ErrNoSpace)
}
