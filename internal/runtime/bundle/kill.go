package bundle

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// KillWait SIGKILLs pid, the init of sandbox id, and waits until it has
// exited, which (being the pid namespace's init) means every process of
// the sandbox is gone.
func KillWait(ctx context.Context, id string, pid int) error {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return nil
		}
		return fmt.Errorf("pidfd %d: %w", pid, err)
	}
	defer unix.Close(fd)
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("kill %d: %w", pid, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	for {
		ms := int(time.Until(deadline).Milliseconds())
		if ms <= 0 {
			return fmt.Errorf("init %d of %s did not exit", pid, id)
		}
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, ms)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("wait for %d: %w", pid, err)
		}
		if n > 0 {
			return nil
		}
	}
}
