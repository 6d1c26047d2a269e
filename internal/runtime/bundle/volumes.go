package bundle

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
)

// Team volumes (internal/volume) in a sandbox. A volume's filesystem is
// mounted once on the host, private to the server; each sandbox gets its
// own mount of it in its bundle, <bundle>/volumes/<i>, which config.json
// binds at the volume's path:
//
//   - in a user namespace of its own (container tier), an idmapped mount
//     into the sandbox's uid range: files are stored with the ids the
//     sandbox sees (0..65535), so two sandboxes in different ranges see the
//     same owners, and what one writes as uid n the other reads as uid n;
//   - otherwise (gVisor, --userns=false) a plain clone of the mount: there
//     the sandbox's ids are the host's (gVisor's gofer creates files with
//     the ids the sandbox's kernel asks for).
//
// Both are nosuid and nodev. The mounts are binds of the bundle, so CRIU
// treats them as external mounts that a restore binds again from the same
// (resume) or the new bundle (fork, snapshot), and they outlive a restart
// of the server like the rootfs overlay. Everything that removes a bundle
// directory detaches them first and refuses to go on while one is still
// mounted: a recursive removal must never reach a volume's files.

// volumesDir is where a bundle's volume mounts live.
const volumesDir = "volumes"

// volumeTarget is the bundle's mount of its i-th volume.
func volumeTarget(dir string, i int) string {
	return filepath.Join(dir, volumesDir, strconv.Itoa(i))
}

// mountVolumes mounts vols in bundle dir: idmapped into the range at base
// with userns, else plain clones. It adds their removal to rb.
func (s *Store) mountVolumes(ctx context.Context, dir string, vols []runtime.VolumeMount, userns bool, base uint32, rb *Rollback) error {
	if len(vols) == 0 {
		return nil
	}
	if err := os.Mkdir(filepath.Join(dir, volumesDir), 0o755); err != nil {
		return fmt.Errorf("volumes: %w", err)
	}
	rb.Add(func() { _ = unmountVolumes(dir) })
	for i, v := range vols {
		target := volumeTarget(dir, i)
		if err := os.Mkdir(target, 0o755); err != nil {
			return fmt.Errorf("volume at %s: %w", v.Path, err)
		}
		const attrs = unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV
		var err error
		if userns {
			err = s.mountIdmapped(ctx, v.Source, target, 0, base, attrs)
			if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) {
				// Unlike template layers there is no copy to fall back on:
				// a volume is written by every sandbox that mounts it.
				err = fmt.Errorf("this host cannot make idmapped mounts (kernel 5.12 or newer), which volumes need in user-namespaced sandboxes: %w: %w", err, errdefs.ErrUnavailable)
			}
		} else {
			err = cloneMount(v.Source, target, attrs)
		}
		if err != nil {
			return fmt.Errorf("volume at %s: %w", v.Path, err)
		}
	}
	return nil
}

// cloneMount mounts a clone of the mount at src on target with attrs.
func cloneMount(src, target string, attrs uint64) error {
	fd, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("open_tree %s: %w", src, err)
	}
	defer unix.Close(fd)
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &unix.MountAttr{Attr_set: attrs}); err != nil {
		return fmt.Errorf("mount_setattr %s: %w", src, err)
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("move_mount %s: %w", target, err)
	}
	return nil
}

// unmountVolumes detaches every volume mount of bundle dir. It fails if
// one is still mounted afterwards, so that no caller removes the bundle
// recursively through a volume.
func unmountVolumes(dir string) error {
	entries, err := os.ReadDir(filepath.Join(dir, volumesDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("volume mounts: %w", err)
	}
	var errs []error
	for _, e := range entries {
		p := filepath.Join(dir, volumesDir, e.Name())
		for range 100 {
			if !IsMountPoint(p) {
				break
			}
			if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
				errs = append(errs, fmt.Errorf("unmount volume %s: %w", p, err))
				break
			}
		}
		if IsMountPoint(p) {
			errs = append(errs, fmt.Errorf("volume %s is still mounted", p))
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeBundleDir removes bundle dir and everything in it, after its
// volume mounts: it leaves the directory in place rather than remove
// through a volume that is still mounted.
func removeBundleDir(dir string) error {
	if err := unmountVolumes(dir); err != nil {
		return fmt.Errorf("bundle %s kept: %w", dir, err)
	}
	return os.RemoveAll(dir)
}

// addVolumeMounts binds the bundle's volume mounts into oci, after every
// other mount (a volume under /tmp goes on top of the /tmp tmpfs).
func addVolumeMounts(oci *specs.Spec, dir string, vols []runtime.VolumeMount) {
	for i, v := range vols {
		oci.Mounts = append(oci.Mounts, specs.Mount{
			Destination: v.Path, Type: "bind", Source: volumeTarget(dir, i),
			Options: []string{"bind", "rw", "nosuid", "nodev"},
		})
	}
}
