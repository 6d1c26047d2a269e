package bundle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
)

// Options are what the driver decides of a bundle.
type Options struct {
	// Tier is recorded in the bundle (and its annotation).
	Tier string
	// UserNS runs the sandbox in a user namespace of its own, with a host
	// uid range of its own and its layers mapped into it.
	UserNS bool
	// OwnNet: the netns is made with the sandbox's user namespace (no
	// path in config.json) and handed to the network package after.
	OwnNet bool
	// Harden is the driver's own hardening of the spec, applied after the
	// shared one (Harden).
	Harden func(*specs.Spec)
	// HidePaths binds the /etc files, the boot id, the log dir and envd
	// from the bundle's view (view.go), so that the sandbox's mountinfo
	// names no host path. gVisor's mount table is its own and needs none.
	HidePaths bool
}

// Built is a bundle Build made.
type Built struct {
	Dir  string
	Base uint32 // first host id of its user namespace's range (UserNS)
}

// Build makes sandbox spec.ID's bundle: directories, the writable layer
// (on a disk of its own with a disk limit), the overlay rootfs over the
// layers (mapped into the sandbox's uid range), /etc files and the
// hardened config.json. On error it leaves nothing behind; otherwise the
// caller runs the returned rollback if a later step fails.
func (s *Store) Build(ctx context.Context, spec runtime.Spec, o Options) (b Built, rb Rollback, err error) {
	if err := CheckID(spec.ID); err != nil {
		return b, Rollback{}, err
	}
	if len(spec.Layers) == 0 {
		return b, Rollback{}, fmt.Errorf("sandbox %s: no rootfs layers: %w", spec.ID, errdefs.ErrInvalidArgument)
	}
	dir := s.Dir(spec.ID)
	ph := NewPhases()
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return b, Rollback{}, fmt.Errorf("sandbox %s: %w", spec.ID, errdefs.ErrConflict)
		}
		return b, Rollback{}, fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	defer func() {
		if err != nil {
			rb.Run()
			rb = Rollback{}
			return
		}
		s.log.Debug("bundle built", append([]any{"id", spec.ID}, ph.Attrs()...)...)
	}()
	rb.Add(func() { _ = removeBundleDir(dir) })
	b.Dir = dir
	if err := os.WriteFile(filepath.Join(dir, idFile), []byte(spec.ID+"\n"), 0o600); err != nil {
		return b, rb, fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	if o.UserNS {
		// Held by the bundle dir: free again once it is gone.
		if b.Base, err = s.uids.alloc(dir); err != nil {
			return b, rb, fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
	}
	for _, sub := range []string{"upper", "work", "rootfs", "log"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o755); err != nil {
			return b, rb, fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
	}
	if err := SetTier(dir, o.Tier); err != nil {
		return b, rb, fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	ph.Mark("dirs")
	onDisk := spec.Resources.DiskMB > 0
	if onDisk {
		if err := s.mountDisk(ctx, dir, spec.Resources.DiskMB); err != nil {
			return b, rb, fmt.Errorf("sandbox %s: writable layer: %w", spec.ID, err)
		}
		rb.Add(func() { _ = unmountDisk(dir) })
	}
	ph.Mark("disk")
	upper, work := LayerDirs(dir, onDisk)
	if err := s.mountRootfs(ctx, spec, o, dir, b.Base, upper, work, &rb); err != nil {
		return b, rb, err
	}
	ph.Mark("rootfs")
	if err := s.mountVolumes(ctx, dir, spec.Volumes, o.UserNS, b.Base, &rb); err != nil {
		return b, rb, fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	if err := writeEtc(dir, spec); err != nil {
		return b, rb, fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	ph.Mark("volumes and etc")
	if o.HidePaths {
		if err := s.mountView(dir, o.UserNS, b.Base); err != nil {
			return b, rb, fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
		rb.Add(func() { _ = unmountView(dir) })
	}
	ph.Mark("view")
	if err := WriteConfig(dir, s.HardenedSpec(spec, dir, o, b.Base)); err != nil {
		return b, rb, fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	ph.Mark("config")
	return b, rb, nil
}

// mountRootfs mounts the overlay of bundle dir over spec's layers (mapped
// into the range at base with o.UserNS, whose root then owns upper).
func (s *Store) mountRootfs(ctx context.Context, spec runtime.Spec, o Options, dir string, base uint32, upper, work string, rb *Rollback) error {
	rootfs := filepath.Join(dir, "rootfs")
	lower := slices.Clone(spec.Layers)
	if o.UserNS {
		var err error
		if lower, err = s.mappedLayers(ctx, lower, base); err != nil {
			return fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
		if err := s.prepareUserNSBundle(dir, base, upper); err != nil {
			return fmt.Errorf("sandbox %s: user namespace: %w", spec.ID, err)
		}
	}
	slices.Reverse(lower) // overlay wants the topmost layer first
	if err := os.WriteFile(filepath.Join(dir, layersFile), []byte(strings.Join(lower, "\n")+"\n"), 0o600); err != nil {
		return fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	opts, done, err := runtime.OverlayOptions(lower, upper, work)
	if err != nil {
		return fmt.Errorf("sandbox %s: mount overlay: %w", spec.ID, err)
	}
	err = unix.Mount("overlay", rootfs, "overlay", 0, opts)
	done()
	s.idmapsMounted(lower)
	if err != nil {
		return fmt.Errorf("sandbox %s: mount overlay: %w", spec.ID, err)
	}
	rb.Add(func() { _ = Unmount(rootfs) })
	return nil
}

// layersFile lists, one a line, the host paths of the lower layers of the
// bundle's overlay: its mount options do not name them (runtime.OverlayOptions).
const layersFile = "layers"

// BuildFromImage builds the bundle of a sandbox restored from another
// one's image: the overlay over spec.Layers (whose top is the captured
// writable layer), a fresh upper, config.json for the new id (not
// hardened: the image brings its processes' seccomp and capabilities) and
// the captured log dir (envd's log is open in the image). With o.UserNS it
// runs in the range at base, the image's. On error it leaves nothing
// behind; otherwise the caller runs the returned rollback on a later error.
func (s *Store) BuildFromImage(ctx context.Context, spec runtime.Spec, o Options, base uint32) (rb Rollback, err error) {
	dir := s.Dir(spec.ID)
	if len(spec.Layers) == 0 {
		return Rollback{}, fmt.Errorf("sandbox %s: no rootfs layers: %w", spec.ID, errdefs.ErrInvalidArgument)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return Rollback{}, fmt.Errorf("sandbox %s: %w", spec.ID, errdefs.ErrConflict)
		}
		return Rollback{}, fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	defer func() {
		if err != nil {
			rb.Run()
			rb = Rollback{}
		}
	}()
	rb.Add(func() { _ = removeBundleDir(dir) })
	if err := os.WriteFile(filepath.Join(dir, idFile), []byte(spec.ID+"\n"), 0o600); err != nil {
		return rb, fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	if o.UserNS {
		if err := s.uids.hold(base, dir); err != nil {
			return rb, fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "rootfs"), 0o755); err != nil {
		return rb, fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	// The new writable layer gets the same kind of disk as a fresh sandbox.
	onDisk := spec.Resources.DiskMB > 0
	if onDisk {
		if err := s.mountDisk(ctx, dir, spec.Resources.DiskMB); err != nil {
			return rb, fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
		rb.Add(func() { _ = unmountDisk(dir) })
	}
	upper, work := LayerDirs(dir, onDisk)
	if !onDisk {
		for _, d := range []string{upper, work} {
			if err := os.Mkdir(d, 0o755); err != nil {
				return rb, fmt.Errorf("sandbox %s: %w", spec.ID, err)
			}
		}
	}
	top := spec.Layers[len(spec.Layers)-1]
	if err := copyTree(ctx, top+".log", filepath.Join(dir, "log")); err != nil {
		if err := os.Mkdir(filepath.Join(dir, "log"), 0o755); err != nil {
			return rb, fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
	} else if o.UserNS {
		// envd's log is open in the image: its owner must be the new
		// sandbox's (the capture is stored unshifted).
		if err := s.shiftInto(filepath.Join(dir, "log"), base); err != nil {
			return rb, fmt.Errorf("sandbox %s: log dir: %w", spec.ID, err)
		}
	}
	if err := s.mountRootfs(ctx, spec, o, dir, base, upper, work, &rb); err != nil {
		return rb, err
	}
	if err := s.mountVolumes(ctx, dir, spec.Volumes, o.UserNS, base, &rb); err != nil {
		return rb, fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	if err := writeEtc(dir, spec); err != nil {
		return rb, fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	if o.HidePaths {
		if err := s.mountView(dir, o.UserNS, base); err != nil {
			return rb, fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
		rb.Add(func() { _ = unmountView(dir) })
	}
	oci := s.OCISpec(spec, dir, o, base)
	addVolumeMounts(oci, dir, spec.Volumes)
	if err := WriteConfig(dir, oci); err != nil {
		return rb, err
	}
	rb.Add(func() { _ = s.RemoveCgroups(s.CgroupPath(spec.ID)) })
	return rb, nil
}

// WriteConfig writes oci as the config.json of the bundle in dir.
func WriteConfig(dir string, oci *specs.Spec) error {
	b, err := json.MarshalIndent(oci, "", "\t")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600)
}

// writeEtc writes the files bind-mounted over the sandbox's /etc/hosts,
// /etc/hostname and /etc/resolv.conf. The hostname resolves locally so
// tools that look it up (getfqdn, sudo) never wait on DNS.
func writeEtc(dir string, spec runtime.Spec) error {
	hosts := "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t" + spec.ID + "\n"
	var resolv strings.Builder
	for _, ns := range spec.DNS {
		fmt.Fprintf(&resolv, "nameserver %s\n", ns)
	}
	for name, content := range map[string]string{
		"hosts":       hosts,
		"hostname":    spec.ID + "\n",
		"resolv.conf": resolv.String(),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// Remove removes what Build made of sandbox id once its container is gone:
// the rootfs mount, idmapped layers no other sandbox uses, the disk, the
// volume mounts, the bundle directory and the cgroups. Removing an unknown id is not an error.
func (s *Store) Remove(id string) error {
	dir := s.Dir(id)
	cgPath := s.BundleCgroupPath(id)
	var errs []error
	if err := unmountView(dir); err != nil {
		errs = append(errs, err)
	}
	if err := Unmount(filepath.Join(dir, "rootfs")); err != nil {
		errs = append(errs, err)
	} else {
		_ = os.Remove(filepath.Join(dir, layersFile)) // its layers are free now
	}
	s.releaseIdmaps()
	if err := unmountDisk(dir); err != nil {
		errs = append(errs, err)
	}
	if err := removeBundleDir(dir); err != nil {
		errs = append(errs, err)
	}
	if err := s.RemoveCgroups(cgPath); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// EnsureRootfs checks that the bundle's overlay is still mounted (it is
// unless the host rebooted, which also loses the network namespace).
func EnsureRootfs(dir string) error {
	rootfs := filepath.Join(dir, "rootfs")
	var st, parent unix.Stat_t
	if err := unix.Stat(rootfs, &st); err != nil {
		return err
	}
	if err := unix.Stat(dir, &parent); err != nil {
		return err
	}
	if st.Dev == parent.Dev {
		return fmt.Errorf("rootfs %s is not mounted: %w", rootfs, errdefs.ErrUnavailable)
	}
	return nil
}

// Stats reads the sandbox's cgroup and the size of its writable layer.
func (s *Store) Stats(id string) (runtime.Stats, error) {
	if err := CheckID(id); err != nil {
		return runtime.Stats{}, err
	}
	dir := s.Dir(id)
	if _, err := os.Stat(dir); err != nil {
		return runtime.Stats{}, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	st := runtime.Stats{Timestamp: time.Now()}
	if err := s.cgroupStats(s.BundleCgroupPath(id), &st); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return runtime.Stats{}, fmt.Errorf("sandbox %s cgroup: %w", id, errdefs.ErrNotFound)
		}
		return runtime.Stats{}, fmt.Errorf("sandbox %s stats: %w", id, err)
	}
	// A disk of its own answers with one statfs; otherwise the writable
	// layer is walked and config.json read for the limit.
	if used, total, ok := diskUsageStatfs(dir); ok {
		st.DiskUsed, st.DiskTotal = used, total
		return st, nil
	}
	st.DiskUsed = diskUsage(filepath.Join(dir, "upper"))
	if mb := s.DiskMB(id); mb > 0 {
		st.DiskTotal = uint64(mb) << 20
	} else {
		var sfs unix.Statfs_t
		if err := unix.Statfs(s.cfg.StateDir, &sfs); err == nil {
			st.DiskTotal = sfs.Blocks * uint64(sfs.Bsize)
		}
	}
	return st, nil
}

// DiskMB is the disk limit recorded in the bundle (0 = none).
func (s *Store) DiskMB(id string) int {
	oci, err := ReadSpec(s.Dir(id))
	if err != nil {
		return 0
	}
	var mb int
	fmt.Sscan(oci.Annotations[annotationDiskMB], &mb)
	return mb
}

// annotationDiskMB records Resources.DiskMB in the bundle, for Stats.
const annotationDiskMB = "io.agentbox.disk-mb"

// diskUsage sums allocated blocks under dir.
func diskUsage(dir string) uint64 {
	var total uint64
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			total += uint64(st.Blocks) * 512
		}
		return nil
	})
	return total
}
