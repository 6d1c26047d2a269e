package bundle

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A user-namespaced sandbox must see its template's files owned by ids of
// its namespace. An idmapped mount of each layer into the sandbox's range
// (one per layer and range, shared by the sandboxes of that range: a
// sandbox and the forks restored in its range) shows them shifted into the
// range without copying anything;
// overlayfs takes such mounts as lower layers. Kernels or filesystems that
// cannot idmap fall back to a uid-shifted copy (shiftedLayer).

// errNoIdmap: this host cannot make idmapped mounts (kernel, filesystem).
var errNoIdmap = errors.New("idmapped mounts unavailable")

// idmapper keeps the idmapped mounts of one Store.
type idmapper struct {
	dir string // mount points, <dir>/<hash of the layer path>

	mu       sync.Mutex
	disabled error          // why idmapped mounts do not work here, once seen
	pending  map[string]int // mounts handed out whose overlay is not mounted yet
}

// idmappedLayer returns the idmapped mount of layer, making it if needed.
func (s *Store) idmappedLayer(ctx context.Context, layer string, from, to uint32) (string, error) {
	im := &s.idmap
	im.mu.Lock()
	defer im.mu.Unlock()
	if im.disabled != nil {
		return "", fmt.Errorf("%w: %w", errNoIdmap, im.disabled)
	}
	h := sha256.Sum256(fmt.Appendf(nil, "%s\x00%d\x00%d", filepath.Clean(layer), from, to))
	target := filepath.Join(im.dir, hex.EncodeToString(h[:12]))
	if im.pending == nil {
		im.pending = map[string]int{}
	}
	if IsMountPoint(target) {
		im.pending[target]++
		return target, nil
	}
	// Private: the mount points are in every host user's mountinfo, and
	// overlay reaches its lower dirs with the server's (root's) rights,
	// so no one else needs to walk here.
	if err := os.MkdirAll(im.dir, 0o700); err != nil {
		return "", err
	}
	if err := os.Chmod(im.dir, 0o700); err != nil {
		return "", err
	}
	if err := os.Mkdir(target, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return "", err
	}
	t0 := time.Now()
	if err := s.mountIdmapped(ctx, layer, target, from, to, unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV); err != nil {
		_ = os.Remove(target)
		if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EPERM) || errors.Is(err, unix.EOPNOTSUPP) {
			im.disabled = err
			s.log.Warn("idmapped mounts unavailable; template layers get uid-shifted copies instead", "err", err)
			return "", fmt.Errorf("%w: %w", errNoIdmap, err)
		}
		return "", err
	}
	s.log.Debug("idmapped layer mounted", "layer", layer, "to", to, "took", time.Since(t0).Round(time.Microsecond))
	im.pending[target]++
	return target, nil
}

// idmapsMounted ends what idmappedLayer began: the overlay over layers is
// mounted (or failed), so only mount references keep them from now on.
func (s *Store) idmapsMounted(layers []string) {
	im := &s.idmap
	im.mu.Lock()
	defer im.mu.Unlock()
	for _, l := range layers {
		if im.pending[l] > 1 {
			im.pending[l]--
		} else {
			delete(im.pending, l)
		}
	}
}

// releaseIdmaps unmounts the idmapped layers no overlay uses any more (and
// no create is about to): a template deleted after its last sandbox is gone
// must not stay pinned, and GC sees a layer in use through them.
func (s *Store) releaseIdmaps() {
	im := &s.idmap
	im.mu.Lock()
	defer im.mu.Unlock()
	entries, err := os.ReadDir(im.dir)
	if err != nil || len(entries) == 0 {
		return
	}
	mountinfo, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var overlays []string
	for line := range strings.Lines(string(mountinfo)) {
		if strings.Contains(line, " - overlay ") {
			overlays = append(overlays, line)
		}
	}
	// Overlays name their layers by descriptor (runtime.OverlayOptions); each
	// bundle lists them in its layers file.
	listed, _ := filepath.Glob(filepath.Join(s.cfg.StateDir, "*", layersFile))
	for _, f := range listed {
		if b, err := os.ReadFile(f); err == nil {
			overlays = append(overlays, string(b))
		}
	}
	for _, e := range entries {
		p := filepath.Join(im.dir, e.Name())
		if im.pending[p] > 0 || slices.ContainsFunc(overlays, func(l string) bool { return strings.Contains(l, p) }) {
			continue
		}
		dropMountPoint(p)
	}
}

// mountIdmapped mounts a clone of the mount at layer on target with its ids
// shifted (on-disk owner from+n shows as host id to+n) and the mount
// attributes attrs (MOUNT_ATTR_*). The id mapping comes from a user
// namespace made for the occasion by a short-lived child (a Go process
// cannot unshare one), the hold hook; the mount keeps its own reference to
// it.
func (s *Store) mountIdmapped(ctx context.Context, layer, target string, from, to uint32, attrs uint64) error {
	if s.cfg.HookBinary == "" {
		return fmt.Errorf("id-mapping user namespace: no hook binary configured: %w", unix.ENOSYS)
	}
	argv := s.HookArgv(HoldHook)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	// On-disk owner from+n shows as host id to+n.
	m := []syscall.SysProcIDMap{{ContainerID: int(from), HostID: int(to), Size: int(s.cfg.UserNSSize)}}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWUSER, UidMappings: m, GidMappings: m, Pdeathsig: unix.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("id-mapping user namespace: %w", err)
	}
	defer func() {
		stdin.Close()
		_ = cmd.Wait()
	}()
	userns, err := os.Open("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/ns/user")
	if err != nil {
		return err
	}
	defer userns.Close()
	fd, err := unix.OpenTree(unix.AT_FDCWD, layer, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("idmap %s: open_tree: %w", layer, err)
	}
	defer unix.Close(fd)
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP | attrs, Userns_fd: uint64(userns.Fd())}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		return fmt.Errorf("idmap %s: mount_setattr: %w", layer, err)
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("idmap %s: move_mount: %w", layer, err)
	}
	return nil
}

// IsMountPoint reports whether path is the root of a mount. (Comparing
// device numbers with the parent fails for a bind mount of the same
// filesystem, which an idmapped mount of a layer on the root disk is.)
func IsMountPoint(path string) bool {
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, unix.AT_SYMLINK_NOFOLLOW, 0, &stx); err != nil {
		return false
	}
	return stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 && stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0
}

// ResetIdmaps detaches the idmapped mounts an earlier process left: they
// are made again on demand, so a deleted template's layer is not pinned
// forever. Running sandboxes keep theirs through their overlay.
func (s *Store) ResetIdmaps() {
	entries, err := os.ReadDir(s.idmap.dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		dropMountPoint(filepath.Join(s.idmap.dir, e.Name()))
	}
}

// dropMountPoint detaches every mount stacked on p (one at a time) and
// removes the directory.
func dropMountPoint(p string) {
	for range 100 {
		if unix.Unmount(p, unix.MNT_DETACH) != nil {
			break
		}
	}
	_ = os.Remove(p)
}
