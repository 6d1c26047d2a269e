// Package bundle owns the host side of a container sandbox, whichever OCI
// runtime runs it: one bundle directory per sandbox (overlay rootfs over the
// template layers, its writable layer and disk, config.json built from
// runtime-spec types and hardened, /etc files, log dir), the sandbox's
// cgroup, its host uid range and idmapped layers, and its checkpoint
// images' layout. The runc and runsc drivers build and remove sandboxes
// through one Store. Everything lives on disk, so a restarted server finds,
// inspects and deletes what an earlier process made.
package bundle

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/hostkey"
	"github.com/agentbox/agentbox/internal/rollback"
	"github.com/agentbox/agentbox/internal/runtime"
)

// Config configures a Store. Zero values take the defaults.
type Config struct {
	// StateDir holds one bundle directory per sandbox. Required (e.g.
	// /var/lib/agentbox/sandboxes).
	StateDir string
	// EnvdPath is the host path of the static envd binary, bind-mounted
	// read-only at runtime.EnvdPathInSandbox. Required.
	EnvdPath string
	// CgroupParent is the cgroup (relative to each hierarchy's root) under
	// which every sandbox gets <CgroupParent>/<key>. Default "agentbox".
	CgroupParent string
	// DiskImageDir caches the formatted empty images that size-limited
	// writable layers are copied from. Default <StateDir>/../disk-images.
	DiskImageDir string
	// DiskPool is how many size-limited disks are kept made, attached and
	// mounted ahead of creates (diskpool.go); 0 makes each in its create.
	DiskPool int
	// UserNS lets drivers run sandboxes in a user namespace of their own,
	// each with a host id range of its own (userns.go).
	UserNS bool
	// UserNSBase is the first host id of the pool of ranges, UserNSSize
	// the ids of one sandbox's range and UserNSRanges the number of
	// ranges (uidrange.go). Defaults DefaultUserNSBase, DefaultUserNSSize
	// and DefaultUserNSRanges.
	UserNSBase, UserNSSize, UserNSRanges uint32
	// UIDRangeDir records which ranges are in use. Default
	// <StateDir>/../uid-ranges.
	UIDRangeDir string
	// IdmapDir is where idmapped template layers are mounted; it should be
	// on a tmpfs, so a reboot forgets them. Default <StateDir>/../idmap.
	IdmapDir string
	// HookBinary is the agentbox binary, whose hidden `__hook` subcommand
	// runs the runtime's helpers (hooks.go). Required with UserNS.
	HookBinary string
}

// Store builds, inspects and removes sandbox bundles. It keeps no state in
// memory besides its configuration, the idmapped mounts being handed out
// and the disks made ahead, so it is safe for concurrent use and across
// restarts.
type Store struct {
	cfg      Config
	log      *slog.Logger
	cgroupV2 bool
	nofile   uint64 // RLIMIT_NOFILE given to envd
	idmap    idmapper
	keys     hostkey.Keyer // names host paths (hostpaths.go)
	uids     uidPool
	disks    *diskPool // nil: none
}

// validID matches ids that are safe as a container id, a directory name
// and a cgroup name.
var validID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// CheckID returns an errdefs.ErrInvalidArgument error for an id that is not
// safe as a container id, a directory name and a cgroup name.
func CheckID(id string) error {
	if !validID.MatchString(id) {
		return fmt.Errorf("sandbox id %q: %w", id, errdefs.ErrInvalidArgument)
	}
	return nil
}

// New checks cfg, makes the state dir and the sandboxes' parent cgroup.
func New(cfg Config, log *slog.Logger) (*Store, error) {
	if cfg.StateDir == "" {
		return nil, fmt.Errorf("bundles: StateDir is required: %w", errdefs.ErrInvalidArgument)
	}
	if cfg.EnvdPath == "" {
		return nil, fmt.Errorf("bundles: EnvdPath is required: %w", errdefs.ErrInvalidArgument)
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = "agentbox"
	}
	if cfg.DiskImageDir == "" {
		cfg.DiskImageDir = filepath.Join(filepath.Dir(cfg.StateDir), "disk-images")
	}
	if cfg.UserNSBase == 0 {
		cfg.UserNSBase = DefaultUserNSBase
	}
	if cfg.UserNSSize == 0 {
		cfg.UserNSSize = DefaultUserNSSize
	}
	if cfg.UserNSRanges == 0 {
		cfg.UserNSRanges = DefaultUserNSRanges
	}
	if uint64(cfg.UserNSBase)+uint64(cfg.UserNSSize)*uint64(cfg.UserNSRanges) > 1<<32-2 {
		return nil, fmt.Errorf("bundles: %d ranges of %d host ids from %d pass the largest uid: %w", cfg.UserNSRanges, cfg.UserNSSize, cfg.UserNSBase, errdefs.ErrInvalidArgument)
	}
	if cfg.UIDRangeDir == "" {
		cfg.UIDRangeDir = filepath.Join(filepath.Dir(cfg.StateDir), "uid-ranges")
	}
	if cfg.IdmapDir == "" {
		cfg.IdmapDir = filepath.Join(filepath.Dir(cfg.StateDir), "idmap")
	}
	if log == nil {
		log = slog.Default()
	}
	// Searchable (mapped roots walk to their own bundle), never listable:
	// entries are named by sandbox key.
	if err := MkdirPrivate(cfg.StateDir); err != nil {
		return nil, fmt.Errorf("bundles: %w", err)
	}
	if cfg.UserNS {
		if err := EnsureSearchable(cfg.StateDir); err != nil {
			return nil, fmt.Errorf("bundles: user namespaces: %w", err)
		}
		if err := raiseHostInotify(); err != nil {
			return nil, fmt.Errorf("bundles: user namespaces: raise the host's inotify limits: %w", err)
		}
	}
	keys, err := hostkey.Load(filepath.Join(cfg.StateDir, secretFile))
	if err != nil {
		return nil, fmt.Errorf("bundles: %w", err)
	}
	closeBundles(cfg.StateDir)
	s := &Store{cfg: cfg, log: log.With("component", "bundle"), cgroupV2: IsCgroupV2(), keys: keys}
	s.uids = uidPool{dir: cfg.UIDRangeDir, base: cfg.UserNSBase, size: cfg.UserNSSize, count: cfg.UserNSRanges}
	s.idmap.dir = cfg.IdmapDir
	s.ResetIdmaps()
	s.nofile = s.nofileLimit()
	if err := s.setupCgroupParent(); err != nil { // cgroupparent.go
		return nil, err
	}
	if s.disks, err = newDiskPool(filepath.Join(filepath.Dir(cfg.StateDir), DiskPoolDirName), cfg.DiskPool, s.log, s.makeDetachedDisk); err != nil {
		return nil, err
	}
	return s, nil
}

// Close drops the disks made ahead (see DiskPool). Sandboxes keep theirs.
func (s *Store) Close() { s.disks.close() }

// DiskPoolStats are the disks ready in the pool and the creates that took
// one.
func (s *Store) DiskPoolStats() (ready int, taken int64) {
	if s.disks == nil {
		return 0, 0
	}
	return s.disks.size(), s.disks.taken.Load()
}

// closeBundles takes the others' search bit off the user-namespaced
// bundles (owned by their mapped root) in stateDir that an earlier version
// opened when it paused them: their mapped root owns them and needs none.
func closeBundles(stateDir string) {
	entries, _ := os.ReadDir(stateDir)
	for _, e := range entries {
		p := filepath.Join(stateDir, e.Name())
		fi, err := os.Lstat(p)
		if err != nil || !fi.IsDir() || fi.Mode().Perm()&0o007 == 0 {
			continue
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != 0 && fi.Mode().Perm()&0o100 != 0 {
			_ = os.Chmod(p, fi.Mode().Perm()&^0o007)
		}
	}
}

// MkdirPrivate makes dir (and its parents) mode 0711: searchable, never
// listable, for directories whose entries name sandboxes.
func MkdirPrivate(dir string) error {
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return err
	}
	return os.Chmod(dir, 0o711)
}

// StateDir is the directory holding the bundles.
func (s *Store) StateDir() string { return s.cfg.StateDir }

// UserNS reports whether sandboxes may run in user namespaces of their own.
func (s *Store) UserNS() bool { return s.cfg.UserNS }

// UserNSBase is the first host id of the pool of ranges: a sandbox's audit
// session uses it as login uid, and images of a server before per-sandbox
// ranges were taken in that range.
func (s *Store) UserNSBase() uint32 { return s.cfg.UserNSBase }

// HookArgv is the command line of `agentbox __hook args...`.
func (s *Store) HookArgv(args ...string) []string {
	return append([]string{s.cfg.HookBinary, "__hook"}, args...)
}

// HookBinary is the agentbox binary running the hooks ("" if none).
func (s *Store) HookBinary() string { return s.cfg.HookBinary }

// wantNOFILE is the open-files limit sandboxes get where the host allows it.
const wantNOFILE = 1048576

// nofileLimit returns wantNOFILE, or the server's own hard limit when the
// server lacks CAP_SYS_RESOURCE and the OCI runtime therefore cannot raise it.
func (s *Store) nofileLimit() uint64 {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil || lim.Max >= wantNOFILE || hasCap(unix.CAP_SYS_RESOURCE) {
		return wantNOFILE
	}
	s.log.Warn("no CAP_SYS_RESOURCE: sandboxes get the server's open-files limit", "nofile", lim.Max, "wanted", wantNOFILE)
	return lim.Max
}

// NOFILE is the RLIMIT_NOFILE sandboxes get.
func (s *Store) NOFILE() uint64 { return s.nofile }

// hasCap reports whether the process has capability c in its effective set.
func hasCap(c int) bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			var mask uint64
			if _, err := fmt.Sscanf(strings.TrimSpace(v), "%x", &mask); err != nil {
				return false
			}
			return mask&(1<<uint(c)) != 0
		}
	}
	return false
}

// Rollback undoes completed setup steps in reverse order: the shared undo
// list (internal/rollback) with steps that clean up as best they can and
// report nothing.
type Rollback struct{ l rollback.List }

// Add appends an undo step.
func (rb *Rollback) Add(f func()) {
	rb.l.Add("bundle", func(context.Context) error { f(); return nil })
}

// Run undoes every step, the last added first.
func (rb *Rollback) Run() { _ = rb.l.Run(context.Background()) }

// Unmount unmounts path, retrying while it is busy (processes of a killed
// container may still be exiting) and detaching it lazily as a last resort.
func Unmount(path string) error {
	var err error
	for range 20 {
		err = unix.Unmount(path, 0)
		if err == nil || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if derr := unix.Unmount(path, unix.MNT_DETACH); derr != nil && !errors.Is(derr, unix.EINVAL) {
		return fmt.Errorf("unmount %s: %w", path, errors.Join(err, derr))
	}
	return nil
}

// List returns the ids of the sandboxes that have a bundle directory.
func (s *Store) List() ([]string, error) {
	entries, err := os.ReadDir(s.cfg.StateDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	var ids []string
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		if id, ok := s.bundleID(e.Name()); ok {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// Exists reports whether sandbox id has a bundle directory.
func (s *Store) Exists(id string) bool {
	_, err := os.Stat(s.Dir(id))
	return err == nil
}

// Delete removes sandbox id in the one order every driver deletes in: its
// processes (killInit: the init and so its whole pid namespace, waited
// for), its runtime's container record (deleteContainer: a missing one is
// not an error), then its bundle (rootfs mount, disk, cgroups, host paths).
// Deleting an unknown id is not an error.
func (s *Store) Delete(ctx context.Context, id string, killInit, deleteContainer func(context.Context, string) error) error {
	if err := CheckID(id); err != nil {
		return err
	}
	var errs []error
	if err := killInit(ctx, id); err != nil {
		s.log.Warn("kill sandbox init; deleting the container takes over", "id", id, "err", err)
	}
	if err := deleteContainer(ctx, id); err != nil {
		errs = append(errs, err)
	}
	if err := s.Remove(id); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("delete sandbox %s: %w", id, err)
	}
	return nil
}

// ContainerStatus maps the status a runc-compatible runtime reports (runc's
// and runsc's state speak OCI's vocabulary) to the sandbox's.
func ContainerStatus(status string) runtime.Status {
	switch status {
	case "running":
		return runtime.StatusRunning
	case "paused", "pausing":
		return runtime.StatusPaused
	default: // created, stopped
		return runtime.StatusStopped
	}
}

// StatusWithoutContainer is the status of sandbox id whose runtime holds no
// container for it: stopped while its bundle exists (a half-done Create or
// Delete, a sandbox paused to an image), so the caller deletes or resumes
// it; else errdefs.ErrNotFound.
func (s *Store) StatusWithoutContainer(id string) (runtime.Status, error) {
	if s.Exists(id) {
		return runtime.StatusStopped, nil
	}
	return "", fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
}

// tierFile records a sandbox's tier in its bundle, so the server routes
// every later call to the driver that made it, also after a restart.
const tierFile = "tier"

// Tier returns the tier recorded in sandbox id's bundle ("" if none:
// bundles of the default tier made by a restore, or by earlier versions).
func (s *Store) Tier(id string) string {
	b, err := os.ReadFile(filepath.Join(s.Dir(id), tierFile))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// SetTier records tier in the bundle in dir.
func SetTier(dir, tier string) error {
	return os.WriteFile(filepath.Join(dir, tierFile), []byte(tier+"\n"), 0o600)
}
