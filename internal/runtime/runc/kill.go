package runc

import (
	"context"
)

// Stop kills the sandbox's processes and removes its container record (a
// filesystem-only pause); the bundle stays.
func (d *Driver) Stop(ctx context.Context, id string) error {
	if err := d.KillInit(ctx, id); err != nil {
		return err
	}
	return d.DeleteContainer(ctx, id)
}
