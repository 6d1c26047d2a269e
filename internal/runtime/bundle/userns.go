package bundle

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// User namespaces on the container tier. Root inside the sandbox is the
// first host uid of the sandbox's own range (uidrange.go; ids
// 0..UserNSSize-1 map onto base..), so whatever escapes the mount namespace
// is an unprivileged host user that owns nothing of any other sandbox, and
// per-user kernel limits (inotify instances and watches, RLIMIT_NPROC, keys)
// count against that uid instead of the host's root.
//
// Template layers (and captured writable layers, which are stored
// unshifted) are shown to the sandbox through idmapped mounts (idmap.go);
// where the kernel cannot idmap, a layer gets a copy whose owners are
// shifted into the range (<layer>.uidshift-<base>), kept beside the layer.

// Defaults of the pool of id ranges: the first starts above the ids of
// regular host users; each sandbox gets 65536 ids.
const (
	DefaultUserNSBase = 100000
	DefaultUserNSSize = 65536
)

// userns adds the user namespace and its id mappings to oci. ownNet: the
// sandbox's netns is made with it (and so owned by it); otherwise the netns
// belongs to the host's, so /sys must be the host's and CRIU cannot
// checkpoint the sandbox.
func (s *Store) userns(oci *specs.Spec, ownNet bool, base uint32) {
	m := []specs.LinuxIDMapping{{ContainerID: 0, HostID: base, Size: s.cfg.UserNSSize}}
	oci.Linux.Namespaces = append(oci.Linux.Namespaces, specs.LinuxNamespace{Type: specs.UserNamespace})
	oci.Linux.UIDMappings, oci.Linux.GIDMappings = m, m
	// envd's reaper moves commands into the user cgroup from inside
	// (usercgroup.go): the cgroup mount is writable, and only the files the
	// server gave the sandbox's root are.
	for i, mnt := range oci.Mounts {
		if mnt.Destination == "/sys/fs/cgroup" {
			oci.Mounts[i].Options = slices.DeleteFunc(slices.Clone(mnt.Options), func(o string) bool { return o == "ro" })
		}
	}
	if ownNet {
		return
	}
	// A new sysfs instance needs CAP_SYS_ADMIN over the network namespace,
	// which here belongs to the host's user namespace; so /sys is the
	// host's sysfs, bound read-only. It must be bound recursively (the
	// kernel refuses to split off a mount with locked submounts); its only
	// submount here, /sys/fs/cgroup, is covered by the sandbox's own cgroup
	// mount, and the masked paths still go on top.
	for i, mnt := range oci.Mounts {
		if mnt.Destination == "/sys" && mnt.Type == "sysfs" {
			oci.Mounts[i] = specs.Mount{Destination: "/sys", Type: "bind", Source: "/sys", Options: []string{"rbind", "nosuid", "noexec", "nodev", "ro"}}
		}
	}
}

// mappedLayers returns the layers a user-namespaced sandbox whose range
// starts at base mounts: an idmapped mount (or, where the kernel cannot,
// the shifted copy) of each layer. Layers are stored unshifted (owned by
// host ids 0..); a layer an earlier version captured shifted into a pool
// range is mapped from that range, or used as it is when it is this one's.
func (s *Store) mappedLayers(ctx context.Context, layers []string, base uint32) ([]string, error) {
	out := make([]string, len(layers))
	for i, l := range layers {
		var st unix.Stat_t
		if err := unix.Stat(l, &st); err != nil {
			return nil, fmt.Errorf("layer %s: %w", l, err)
		}
		from, inPool := s.uids.rangeOf(st.Uid)
		if !inPool {
			from = 0
		}
		if from == base {
			out[i] = l
			continue
		}
		m, err := s.idmappedLayer(ctx, l, from, base)
		if err == nil {
			out[i] = m
			continue
		}
		if !errors.Is(err, errNoIdmap) {
			return nil, err
		}
		if from != 0 {
			return nil, fmt.Errorf("layer %s belongs to host uid range %d and this host cannot idmap it: %w", l, from, err)
		}
		shifted, err := s.shiftedLayer(ctx, l, base)
		if err != nil {
			return nil, err
		}
		out[i] = shifted
	}
	return out, nil
}

// shiftedLayer returns the uid-shifted copy of layer, making it first if
// needed. Concurrent first users each copy into a private temporary dir and
// the first rename wins; the others drop their copy.
func (s *Store) shiftedLayer(ctx context.Context, layer string, base uint32) (string, error) {
	layer = filepath.Clean(layer)
	dst := layer + ".uidshift-" + strconv.FormatUint(uint64(base), 10)
	if _, err := os.Stat(dst); err == nil {
		return dst, nil
	}
	tmp, err := os.MkdirTemp(filepath.Dir(layer), ".uidshift-*")
	if err != nil {
		return "", fmt.Errorf("shift layer %s: %w", layer, err)
	}
	defer os.RemoveAll(tmp)
	copyDir := filepath.Join(tmp, "rootfs")
	s.log.Info("making uid-shifted copy of template layer (once per layer)", "layer", layer, "base", base)
	// cp -a keeps modes, owners, timestamps, xattrs and hardlinks, and
	// writes holes as holes.
	if out, err := exec.CommandContext(ctx, "cp", "-a", "--sparse=always", layer, copyDir).CombinedOutput(); err != nil {
		return "", fmt.Errorf("shift layer %s: cp: %w: %s", layer, err, strings.TrimSpace(string(out)))
	}
	if err := shiftTree(copyDir, 0, base, s.cfg.UserNSSize); err != nil {
		return "", fmt.Errorf("shift layer %s: %w", layer, err)
	}
	if err := os.Rename(copyDir, dst); err != nil {
		if _, serr := os.Stat(dst); serr == nil {
			return dst, nil // another sandbox made it first
		}
		return "", fmt.Errorf("shift layer %s: %w", layer, err)
	}
	return dst, nil
}

// inode identifies a file across its hardlinks.
type inode struct{ dev, ino uint64 }

// shiftTree adds base to the owner and group of everything under root.
// chown clears setuid/setgid bits and file capabilities, so both are put
// back; capabilities are rewritten as v3 with the mapped root as their
// owner, else the kernel ignores them inside the namespace.
func shiftTree(root string, from, to, size uint32) error {
	seen := map[inode]bool{}
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			return err
		}
		id := inode{uint64(st.Dev), st.Ino}
		if seen[id] {
			return nil // another hardlink of a file already shifted
		}
		seen[id] = true
		if st.Mode&syscall.S_IFMT == syscall.S_IFCHR && st.Rdev == 0 && (st.Uid < from || st.Uid-from >= size) {
			// An overlay whiteout: the kernel makes it with the mounter's
			// (the host root's) ids, which mean nothing to overlayfs.
			return nil
		}
		if st.Uid < from || st.Gid < from || st.Uid-from >= size || st.Gid-from >= size {
			return fmt.Errorf("%s: owner %d:%d outside the range of %d ids from %d: %w", path, st.Uid, st.Gid, size, from, errdefs.ErrInvalidArgument)
		}
		regular := st.Mode&syscall.S_IFMT == syscall.S_IFREG
		var fcaps []byte
		if regular {
			fcaps = getxattr(path, "security.capability")
		}
		if err := unix.Lchown(path, int(st.Uid-from+to), int(st.Gid-from+to)); err != nil {
			return err
		}
		if regular && st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
			if err := unix.Chmod(path, st.Mode&0o7777); err != nil {
				return err
			}
		}
		if fcaps != nil {
			if err := unix.Lsetxattr(path, "security.capability", capsFor(fcaps, to), 0); err != nil {
				return fmt.Errorf("%s: file capabilities: %w", path, err)
			}
		}
		return nil
	})
}

// getxattr returns the value of attribute name of path, nil if unset.
func getxattr(path, name string) []byte {
	buf := make([]byte, 64)
	n, err := unix.Lgetxattr(path, name, buf)
	if err != nil {
		return nil
	}
	return buf[:n]
}

// File capability xattr layout (linux/capability.h): a magic/revision word,
// then permitted and inheritable words (two each for v2 and v3), and for v3
// the namespace root uid they belong to.
const (
	vfsCapRevisionMask = 0xFF000000
	vfsCapRevision2    = 0x02000000
	vfsCapRevision3    = 0x03000000
	vfsCapV2Size       = 4 + 2*8
)

// capsFor rewrites a v2 or v3 file capability value for namespace root
// uid: v3 with that root, or for uid 0 (an unshifted layer) v2, which an
// idmapped mount shows as belonging to the mount's namespace root.
func capsFor(v []byte, rootUID uint32) []byte {
	if rootUID == 0 {
		return capsV2(v)
	}
	return capsV3(v, rootUID)
}

// capsV2 rewrites a v2 or v3 file capability value as v2 (no root uid).
func capsV2(v []byte) []byte {
	if len(v) < vfsCapV2Size {
		return v
	}
	out := make([]byte, vfsCapV2Size)
	copy(out, v[:vfsCapV2Size])
	magic := binary.LittleEndian.Uint32(out)
	binary.LittleEndian.PutUint32(out, magic&^vfsCapRevisionMask|vfsCapRevision2)
	return out
}

// capsV3 rewrites a v2 or v3 file capability value for namespace root uid.
func capsV3(v []byte, rootUID uint32) []byte {
	if len(v) < vfsCapV2Size {
		return v
	}
	out := make([]byte, vfsCapV2Size+4)
	copy(out, v[:vfsCapV2Size])
	magic := binary.LittleEndian.Uint32(out)
	binary.LittleEndian.PutUint32(out, magic&^vfsCapRevisionMask|vfsCapRevision3)
	binary.LittleEndian.PutUint32(out[vfsCapV2Size:], rootUID)
	return out
}

// prepareUserNSBundle hands the parts of bundle dir a user-namespaced
// sandbox writes to its mapped root base (the overlay upper dir, the log
// dir) and lets that uid, and no other but the host's root group, reach
// the rootfs and the bind-mounted files: the bundle is base:0 0710. The
// group is for CRIU's restored root task, which reads its first image
// files as host uid and gid 0 without capabilities.
func (s *Store) prepareUserNSBundle(dir string, base uint32, extra ...string) error {
	if err := os.Lchown(dir, int(base), 0); err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o710); err != nil {
		return err
	}
	root := int(base)
	for _, p := range append([]string{filepath.Join(dir, "log")}, extra...) {
		if err := os.Lchown(p, root, root); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

// EnsureSearchable gives "others" search (not read) permission on dir and
// its ancestors: runc sets up the rootfs and bind mounts as the sandbox's
// mapped root, an unprivileged host uid, which must be able to walk there.
func EnsureSearchable(dir string) error { return EnsureSearchableBy(dir, -1) }

// EnsureSearchableBy is EnsureSearchable for host uid alone: a directory
// uid owns and may search already (a user-namespaced bundle, base:0 0710)
// stays closed to others, so what is in it (the sandbox's upper dir, its
// pause image) is not opened to every host user; uid -1 means anyone.
func EnsureSearchableBy(dir string, uid int) error {
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		owned := false
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && uid >= 0 && int(st.Uid) == uid && fi.Mode().Perm()&0o100 != 0 {
			owned = true
		}
		if !owned && fi.Mode().Perm()&0o001 == 0 {
			if err := os.Chmod(d, fi.Mode().Perm()|0o001); err != nil {
				return err
			}
		}
		if d == "/" || d == "." {
			return nil
		}
	}
}

// Per-user kernel counters (inotify instances and watches) are charged to
// the sandbox's mapped uid inside its namespace and also to the namespace's
// owner in the parent, which is the host's root because runc (as root)
// creates the namespace. So each sandbox's namespace gets its own inotify
// caps (normal per-user Linux defaults), and the host's per-user caps are
// raised far above one sandbox's, so no single sandbox can use up what the
// host's root services need. The sandbox cannot raise its own caps: it has
// no CAP_SYS_RESOURCE. (The sandbox's caps are set by its driver:
// internal/runtime/runc's limitUserNS.)
const (
	hostInotifyInstances = 65536
	hostInotifyWatches   = 4194304
)

// raiseHostInotify lifts the host's per-user inotify caps to at least the
// values above; lower caps are left alone if already higher.
func raiseHostInotify() error {
	for path, want := range map[string]int{
		"/proc/sys/fs/inotify/max_user_instances": hostInotifyInstances,
		"/proc/sys/fs/inotify/max_user_watches":   hostInotifyWatches,
	} {
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if cur, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && cur >= want {
			continue
		}
		if err := os.WriteFile(path, []byte(strconv.Itoa(want)), 0o644); err != nil {
			return err
		}
	}
	return nil
}
