package runc

import (
	"fmt"
	"io"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// runc defends against CVE-2019-5736 (a container overwriting the host's
// runc through /proc/self/exe) by copying its own binary into a sealed
// memfd and re-executing itself from it, in every `runc init`: about 9 MB
// copied, a bind mount or memfd made, and one more execve, per create. It
// skips all of that when it already runs from a memfd carrying exactly
// its seals (runc's is_self_cloned, the mechanism behind upstream's
// memfd-bind). The driver therefore copies runc once, seals it the same
// way and executes that copy: the container still sees a binary no one
// can write (the seals forbid writes, growth and shrinking, and more
// seals), only shared between creates instead of made anew for each.

// runcMemfdSeals are the seals runc checks for (RUNC_MEMFD_SEALS).
const runcMemfdSeals = unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE

// sealedFdMin is the lowest descriptor the sealed copy is kept at: a
// child's stdio and extra files are placed at 0, 1, 2, ... before it
// executes /proc/self/fd/<n>, so n must stay above any of them.
const sealedFdMin = 100

// sealedBinary is an executable sealed in-memory copy of a binary, open
// for the server's life.
type sealedBinary struct {
	f    *os.File
	path string // /proc/self/fd/<n>: in a child, its inherited copy of f
}

// sealBinary copies the binary at path into a sealed memfd. Children
// execute it by its /proc/self/fd path, which they resolve before their
// close-on-exec descriptors close.
func sealBinary(path string) (*sealedBinary, error) {
	src, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer src.Close()
	mfd, err := unix.MemfdCreate("agentbox-runc", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	rw := os.NewFile(uintptr(mfd), "memfd:agentbox-runc")
	defer rw.Close()
	if _, err := io.Copy(rw, src); err != nil {
		return nil, fmt.Errorf("copy %s: %w", path, err)
	}
	if _, err := unix.FcntlInt(uintptr(mfd), unix.F_ADD_SEALS, runcMemfdSeals); err != nil {
		return nil, fmt.Errorf("seal copy of %s: %w", path, err)
	}
	// Keep a read-only descriptor only, high enough that a child's stdio
	// and extra files never land on it.
	ro, err := os.Open("/proc/self/fd/" + strconv.Itoa(mfd))
	if err != nil {
		return nil, fmt.Errorf("reopen sealed copy of %s: %w", path, err)
	}
	defer ro.Close()
	hi, err := unix.FcntlInt(ro.Fd(), unix.F_DUPFD_CLOEXEC, sealedFdMin)
	if err != nil {
		return nil, fmt.Errorf("move sealed copy of %s: %w", path, err)
	}
	f := os.NewFile(uintptr(hi), "memfd:agentbox-runc")
	seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
	if err != nil || seals != runcMemfdSeals {
		f.Close()
		return nil, fmt.Errorf("sealed copy of %s has seals %#x (%v), want %#x", path, seals, err, runcMemfdSeals)
	}
	return &sealedBinary{f: f, path: "/proc/self/fd/" + strconv.Itoa(hi)}, nil
}

// sealedMemfdName is what /proc/<pid>/exe of a process executing the
// sealed copy reads (the kernel's name of a memfd, deleted from the start).
const sealedMemfdName = "/memfd:agentbox-runc (deleted)"

// noteInit checks, for a created container whose init (pid) waits to be
// started, that runc took the fast path: the init still executes the
// sealed copy rather than a copy of its own. It counts the inits that did
// and warns once when one did not (a runc that no longer honours the
// seals), since creates then still work, only slower.
func (d *Driver) noteInit(pid int) {
	if d.sealed == nil {
		return
	}
	exe, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe")
	if err == nil && exe == sealedMemfdName {
		d.sealedInits.Add(1)
		return
	}
	if d.sealedMissed.Swap(true) {
		return
	}
	d.log.Warn("runc init copied itself despite the sealed copy of runc it was started from", "exe", exe, "err", err)
}
