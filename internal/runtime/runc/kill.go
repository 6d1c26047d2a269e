package runc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// killInit SIGKILLs the container's init and waits until it has exited,
// which (being the pid namespace's init) means every sandbox process is
// gone. Doing this ourselves saves the 100 ms polling steps of
// `runc delete --force` on a running container.
func (r *Runtime) killInit(ctx context.Context, id string) error {
	out, err := r.oci(ctx, id, "", "state", id)
	if err != nil {
		return err
	}
	var st struct {
		Status string `json:"status"`
		Pid    int    `json:"pid"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return fmt.Errorf("runc state %s: %w", id, err)
	}
	if st.Pid <= 0 || st.Status == "stopped" {
		return nil
	}
	if st.Status == "paused" {
		// Frozen tasks do not die until thawed.
		if _, err := r.oci(ctx, id, "", "resume", id); err != nil {
			return err
		}
	}
	fd, err := unix.PidfdOpen(st.Pid, 0)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return nil
		}
		return fmt.Errorf("pidfd %d: %w", st.Pid, err)
	}
	defer unix.Close(fd)
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("kill %d: %w", st.Pid, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	for {
		ms := int(time.Until(deadline).Milliseconds())
		if ms <= 0 {
			return fmt.Errorf("init %d of %s did not exit", st.Pid, id)
		}
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, ms)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("wait for %d: %w", st.Pid, err)
		}
		if n > 0 {
			return nil
		}
	}
}
