package runc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/runtime"
)

// fsOnlyMarker is the whole image of a filesystem-only pause or snapshot:
// the state is the writable layer, which stays in the bundle (pause) or was
// copied beside the image (snapshot).
const fsOnlyMarker = "filesystem-only"

func fsOnlyImage(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, fsOnlyMarker))
	return err == nil
}

// fsCheckpoint stops the sandbox and keeps only its files. A pause kills
// every process (the writable layer stays where it is, on the bundle's
// disk); a snapshot (LeaveRunning) freezes the sandbox only while its
// writable layer is copied, so the copy is one instant of the filesystem.
func (r *Runtime) fsCheckpoint(ctx context.Context, id string, opts runtime.CheckpointOptions) (err error) {
	dir := r.dir(id)
	img, own, err := r.imageDir(id, opts)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil && own {
			_ = os.RemoveAll(img)
		}
	}()
	upper, _ := layerDirs(dir, r.diskMB(id) > 0)
	if opts.LeaveRunning {
		if opts.UpperCopy != "" {
			if err := r.Freeze(ctx, id); err != nil {
				return err
			}
			cerr := r.copyUnshifted(ctx, dir, upper, opts.UpperCopy)
			if terr := r.Thaw(context.WithoutCancel(ctx), id); terr != nil {
				cerr = errors.Join(cerr, terr)
			}
			if cerr != nil {
				return fmt.Errorf("sandbox %s: capture writable layer: %w", id, cerr)
			}
		}
	} else {
		if err := r.killInit(ctx, id); err != nil && !notExist(err) {
			return fmt.Errorf("sandbox %s: stop: %w", id, err)
		}
		if _, err := r.oci(ctx, id, "", "delete", "--force", id); err != nil && !notExist(err) {
			return fmt.Errorf("sandbox %s: %w", id, err)
		}
		if r.tierOf(id) == TierRunsc {
			// As after a memory pause: a restarted server learns the
			// sandbox's network from the idle netns's address.
			if err := restoreNetConf(dir); err != nil {
				r.log.Warn("paused gvisor sandbox: netns address not restored; a server restart will not find its network", "id", id, "err", err)
			}
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
		if err := os.RemoveAll(filepath.Join(dir, checkpointDir)); err != nil {
			return err
		}
		return commitImage(dir, img, id)
	}
	return nil
}

// fsRestore boots the sandbox fresh: in place on its bundle (whose rootfs
// still has its writable layer), or as a new sandbox whose top layer is the
// captured one.
func (r *Runtime) fsRestore(ctx context.Context, spec runtime.Spec, inPlace bool) error {
	if !inPlace {
		return r.Create(ctx, spec)
	}
	id, dir := spec.ID, r.dir(spec.ID)
	// A memory pause leaves the container record behind on some tiers.
	if _, err := r.oci(ctx, id, "", "delete", "--force", id); err != nil && !notExist(err) {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	if err := r.ensureRootfs(dir); err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	tier := r.tierOf(id)
	if tier == TierRunsc {
		if err := restoreNetConf(dir); err != nil {
			return fmt.Errorf("sandbox %s: %w", id, err)
		}
	} else if err := criuUnlock(dir); err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	pid, err := r.start(ctx, id, tier, dir, bundleOwnsNetNS(dir))
	if err != nil {
		_, _ = r.oci(context.WithoutCancel(ctx), id, "", "delete", "--force", id)
		return fmt.Errorf("sandbox %s: boot: %w", id, err)
	}
	if r.usernsEnabled(tier) {
		// A fresh boot is a fresh user namespace with default caps.
		if err := r.limitUserNS(ctx, id, pid); err != nil {
			r.log.Warn("resumed sandbox keeps default inotify caps", "id", id, "err", err)
		}
	}
	return nil
}
