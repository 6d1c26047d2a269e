package bundle

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/runtime"
)

// A bind mount's line in /proc/<pid>/mountinfo names its source by the
// path from the root of the source's filesystem: files bound from the
// bundle would tell sandbox code where the server keeps its state. The
// view is a small tmpfs of the bundle's own, so what the sandbox binds from
// it (its /etc files, the boot id) shows as "/hosts" and the like; envd's
// binary and the log dir are overlays mounted inside it whose layers are
// named by descriptor (runtime.OverlayOptions), so they show as "/" and
// "/envd". The files on disk stay where they were: the view is made from
// them at build, and bundles of earlier versions, without one, keep theirs.
const (
	viewDir = "view"
	// viewEmpty (in the view) is an empty lower layer for the log
	// overlay, and the second lower layer of envd's (an overlay without an
	// upper layer needs two); on the view's tmpfs it never overlaps envd's
	// directory. viewLogWork (beside the log dir) is the log overlay's
	// work dir.
	viewEmpty   = "empty"
	viewLogWork = "view-logwork"
	viewBin     = "bin"
)

// envdSource is where envd's binary is bound from for a bundle whose
// view root (viewRoot) is root.
func (s *Store) envdSource(dir, root string) string {
	if root != dir {
		return filepath.Join(root, viewBin, filepath.Base(s.cfg.EnvdPath))
	}
	return s.cfg.EnvdPath
}

// unmountView unmounts bundle dir's view and the overlays in it (a bundle
// without one is left as it is).
func unmountView(dir string) error {
	v := filepath.Join(dir, viewDir)
	return errors.Join(Unmount(filepath.Join(v, viewBin)), Unmount(filepath.Join(v, "log")), Unmount(v))
}

// viewRoot is the directory bundle dir's sandbox-visible files (hosts,
// boot_id, the log dir, …) are bound from: its view when it has a mounted
// one, else dir itself.
func viewRoot(dir string) string {
	v := filepath.Join(dir, viewDir)
	if _, err := os.Stat(filepath.Join(v, "hosts")); err == nil {
		return v
	}
	return dir
}

// ViewFile is the host path sandbox-visible file name (hosts, boot_id, …)
// of bundle dir is bound from: in its view when it has one.
func ViewFile(dir, name string) string {
	return filepath.Join(viewRoot(dir), name)
}

// mountView mounts bundle dir's view: a tmpfs owned by the sandbox's
// mapped root (userns) or root, with copies of the /etc files, the log
// dir and envd's directory overlaid in it.
func (s *Store) mountView(dir string, userns bool, base uint32) (err error) {
	v := filepath.Join(dir, viewDir)
	if err := os.Mkdir(v, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("view: %w", err)
	}
	opts := "mode=0700,size=1m,nr_inodes=64"
	if userns {
		opts = "mode=0710,uid=" + strconv.FormatUint(uint64(base), 10) + ",gid=0,size=1m,nr_inodes=64"
	}
	// No noexec: in a user namespace a bind mount cannot lose a flag of
	// its source, and runc's read-only remount of the /etc files asks for
	// none (nothing in the view is executable).
	if err := unix.Mount("tmpfs", v, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("view: mount tmpfs on %s: %w", v, err)
	}
	defer func() {
		if err != nil {
			_ = unmountView(dir)
		}
	}()
	for _, name := range []string{"hosts", "hostname", "resolv.conf"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return fmt.Errorf("view: %w", err)
		}
		if err := os.WriteFile(filepath.Join(v, name), b, 0o644); err != nil {
			return fmt.Errorf("view: %w", err)
		}
	}
	for _, d := range []string{filepath.Join(v, viewEmpty), filepath.Join(dir, viewLogWork), filepath.Join(v, "log"), filepath.Join(v, viewBin)} {
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("view: %w", err)
		}
	}
	if err := overlay(filepath.Join(v, "log"), []string{filepath.Join(v, viewEmpty)}, filepath.Join(dir, "log"), filepath.Join(dir, viewLogWork), unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC); err != nil {
		return fmt.Errorf("view: log dir: %w", err)
	}
	if err := overlay(filepath.Join(v, viewBin), []string{filepath.Dir(s.cfg.EnvdPath), filepath.Join(v, viewEmpty)}, "", "", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_RDONLY); err != nil {
		return fmt.Errorf("view: envd: %w", err)
	}
	return nil
}

// overlay mounts an overlay of lower (and upper, work unless "") on target.
func overlay(target string, lower []string, upper, work string, flags uintptr) error {
	var opts string
	var done func()
	var err error
	if upper == "" {
		opts, done, err = runtime.LowerOptions(lower)
	} else {
		opts, done, err = runtime.OverlayOptions(lower, upper, work)
	}
	if err != nil {
		return err
	}
	defer done()
	if err := unix.Mount("overlay", target, "overlay", flags, opts); err != nil {
		return fmt.Errorf("mount overlay on %s: %w", target, err)
	}
	return nil
}
