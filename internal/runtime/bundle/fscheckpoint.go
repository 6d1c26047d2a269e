package bundle

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
)

// fsOnlyMarker is the whole image of a filesystem-only pause or snapshot:
// the state is the writable layer, which stays in the bundle (pause) or was
// copied beside the image (snapshot).
const fsOnlyMarker = "filesystem-only"

// FSOnlyImage reports whether dir is the image of a filesystem-only pause.
func FSOnlyImage(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, fsOnlyMarker))
	return err == nil
}

// Container is what a filesystem-only checkpoint needs of the driver that
// runs the sandbox.
type Container interface {
	runtime.Freezer
	// Stop ends every process of the sandbox and removes its container
	// record; the bundle stays.
	Stop(ctx context.Context, id string) error
}

// FSCheckpoint stops the sandbox and keeps only its files. A pause stops
// every process (the writable layer stays where it is, on the bundle's
// disk); a snapshot (LeaveRunning) freezes the sandbox only while its
// writable layer is copied, so the copy is one instant of the filesystem.
func (s *Store) FSCheckpoint(ctx context.Context, id string, opts runtime.CheckpointOptions, c Container) (err error) {
	if err := CheckID(id); err != nil {
		return err
	}
	dir := s.Dir(id)
	if _, err := os.Stat(filepath.Join(dir, "config.json")); err != nil {
		return fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	img, own, err := s.ImageDir(id, opts)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil && own {
			_ = os.RemoveAll(img)
		}
	}()
	upper, _ := LayerDirs(dir, s.DiskMB(id) > 0)
	if opts.LeaveRunning {
		if opts.UpperCopy != "" {
			if err := c.Freeze(ctx, id); err != nil {
				return err
			}
			cerr := s.copyUnshifted(ctx, dir, upper, opts.UpperCopy)
			if terr := c.Thaw(context.WithoutCancel(ctx), id); terr != nil {
				cerr = errors.Join(cerr, terr)
			}
			if cerr != nil {
				return fmt.Errorf("sandbox %s: capture writable layer: %w", id, cerr)
			}
		}
	} else {
		if err := c.Stop(ctx, id); err != nil {
			return fmt.Errorf("sandbox %s: stop: %w", id, err)
		}
		// What the processes wrote is on the writable layer; make it durable
		// before the pause counts as done.
		if f, err := os.Open(upper); err == nil {
			_ = unix.Syncfs(int(f.Fd()))
			f.Close()
		}
	}
	if err := os.WriteFile(filepath.Join(img, fsOnlyMarker), nil, 0o600); err != nil {
		return err
	}
	if own {
		// A memory image being replaced (a fresh boot that failed) goes.
		if err := os.RemoveAll(filepath.Join(dir, CheckpointDir)); err != nil {
			return err
		}
		return CommitImage(dir, img, id)
	}
	return nil
}
