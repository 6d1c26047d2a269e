package runc

import (
	"context"
	"fmt"

	"github.com/agentbox/agentbox/internal/runtime/bundle"
)

// killInit SIGKILLs the container's init and waits until it has exited,
// which (being the pid namespace's init) means every sandbox process is
// gone. Doing this ourselves saves the 100 ms polling steps of
// `runc delete --force` on a running container. A container that does
// not exist is not an error.
func (d *Driver) killInit(ctx context.Context, id string) error {
	// A running init is found without a runc exec (runc.go).
	if pid, ok := d.runningInit(id); ok {
		return bundle.KillWait(ctx, id, pid)
	}
	c, err := d.client("").State(ctx, d.cid(id))
	if err != nil {
		if !d.exists(id) {
			return nil
		}
		return fmt.Errorf("runc state %s: %w", id, err)
	}
	if c.Pid <= 0 || c.Status == "stopped" {
		return nil
	}
	if c.Status == "paused" {
		// Frozen tasks do not die until thawed.
		if err := d.client("").Resume(ctx, d.cid(id)); err != nil {
			return fmt.Errorf("runc resume %s: %w", id, err)
		}
	}
	return bundle.KillWait(ctx, id, c.Pid)
}

// Stop kills the sandbox's processes and removes its container record (a
// filesystem-only pause); the bundle stays.
func (d *Driver) Stop(ctx context.Context, id string) error {
	if err := d.killInit(ctx, id); err != nil {
		return err
	}
	return d.deleteContainer(ctx, id)
}
