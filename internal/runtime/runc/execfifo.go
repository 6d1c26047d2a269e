package runc

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// A created container's init (`runc init`) waits, before it execs the
// sandbox's process, until a reader opens the exec fifo in the container's
// state directory; it writes one byte, execs (the write end is close-on-exec)
// and the reader removes the fifo, which is how runc tells a started
// container from a created one. `runc start` is only that, plus a Go
// runtime start and a read of the state: the driver does it in the server
// and saves the exec on every create. The fifo lives in runc's state root
// (root-only, never in a sandbox's reach). Without a fifo where runc 1.1
// keeps it, the driver falls back to `runc start`.

// execFifo is runc's name of the fifo in a container's state directory.
const execFifo = "exec.fifo"

// errNoExecFifo: the container has no exec fifo where runc keeps it.
var errNoExecFifo = errors.New("no exec fifo")

// startWait bounds how long the init may take to exec once told to.
const startWait = 30 * time.Second

// startInit starts the created container of sandbox id, whose init is pid,
// through its exec fifo (startThroughFifo).
func (d *Driver) startInit(ctx context.Context, id string, pid int) error {
	return startThroughFifo(ctx, filepath.Join(d.cfg.Root, d.CID(id)), pid)
}

// startThroughFifo starts the created container whose runc state directory
// is dir and whose init is pid: it returns once the init has exec'd the
// sandbox's process, or an error if the init died first (errNoExecFifo:
// there is no fifo to start it by).
func startThroughFifo(ctx context.Context, dir string, pid int) error {
	path := filepath.Join(dir, execFifo)
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
		return fmt.Errorf("%w at %s", errNoExecFifo, path)
	}
	// The init is gone if its pidfd reads; a pid that is already gone
	// cannot be started either.
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return fmt.Errorf("init %d: %w", pid, err)
	}
	defer unix.Close(pidfd)
	// Non-blocking: the open must not hang on an init that died before
	// it opened its end.
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer unix.Close(fd)
	deadline := time.Now().Add(startWait)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	buf := make([]byte, 16)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("init %d did not exec within %s", pid, startWait)
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}, {Fd: int32(pidfd), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, int(min(left, 100*time.Millisecond)/time.Millisecond)+1); err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return fmt.Errorf("wait for init %d: %w", pid, err)
		}
		if fds[0].Revents&(unix.POLLIN|unix.POLLHUP) != 0 {
			n, err := unix.Read(fd, buf)
			switch {
			case errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR):
				continue
			case err != nil:
				return fmt.Errorf("read %s: %w", path, err)
			case n == 0:
				// The writer came and went without a word: runc
				// init failed before the exec.
				return fmt.Errorf("init %d closed its exec fifo without starting", pid)
			}
			// The byte came: the init execs now, and its end closes
			// with the exec (a blocking read sees that; poll would
			// not, the writer having come before the reader).
			if err := unix.SetNonblock(fd, false); err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			for {
				n, err := unix.Read(fd, buf)
				if errors.Is(err, unix.EINTR) {
					continue
				}
				if err != nil {
					return fmt.Errorf("read %s: %w", path, err)
				}
				if n == 0 {
					break
				}
			}
			if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("remove %s: %w", path, err)
			}
			return nil
		}
		if fds[1].Revents != 0 {
			return fmt.Errorf("init %d exited before it was started", pid)
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("start init %d: %w", pid, err)
		}
	}
}
