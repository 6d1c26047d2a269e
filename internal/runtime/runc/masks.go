package runc

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/agentbox/agentbox/internal/runtime/bundle"
)

// runc masks a directory (the spec's masked paths /proc/acpi,
// /sys/firmware, /sys/kernel, …) with an empty read-only tmpfs. CRIU would
// archive each tmpfs with tar and gzip at every dump and unpack it at every
// restore: two processes per mask per restore, for a directory that is
// empty. A dump names them external mounts instead, and a restore binds an
// empty read-only tmpfs of the bundle's view there (bundle.MaskDir): read-only
// like runc's, and more so, as its superblock belongs to the host's user
// namespace, which the sandbox's root cannot remount; it names no host path
// in the sandbox's mountinfo. The image lists the masks it left out
// (criuMasks), so images without the list restore as before.
const (
	// criuMasks (in a dump image) holds the mountpoints of the masks the
	// dump left to the restore, one a line.
	criuMasks = "agentbox-masks"
	// maskKeyPrefix starts the CRIU key of a mask's mount.
	maskKeyPrefix = "agentbox-mask"
)

// maskKey is the CRIU key of the mask at mountpoint p ("/sys/kernel" →
// "agentbox-mask-sys-kernel").
func maskKey(p string) string {
	return maskKeyPrefix + strings.ReplaceAll(p, "/", "-")
}

// validMaskPath reports whether p can go into a CRIU option: absolute,
// clean, and of characters that CRIU's option syntax never splits on.
func validMaskPath(p string) bool {
	if p == "" || p[0] != '/' || filepath.Clean(p) != p || p == "/" {
		return false
	}
	for _, r := range p {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("/_.-", r)) {
			return false
		}
	}
	return true
}

// dirMasks returns the masked paths (masked) that are directories masked
// with a read-only tmpfs (or, after such a restore, the bind of an empty
// directory in its place, which shows as the view's tmpfs) in mountinfo,
// the sandbox init's /proc/<pid>/mountinfo. Files are masked with
// /dev/null binds, which CRIU carries without an archive.
func dirMasks(mountinfo []byte, masked []string) []string {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(mountinfo))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source super-options
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 6 || len(g) < 1 || g[0] != "tmpfs" {
			continue
		}
		mp, opts := f[4], strings.Split(f[5], ",")
		if !slices.Contains(opts, "ro") || !slices.Contains(masked, mp) || !validMaskPath(mp) || slices.Contains(out, mp) {
			continue
		}
		out = append(out, mp)
	}
	return out
}

// maskDumpConf returns the CRIU options that leave sandbox id's directory
// masks out of its dump, and the masks. Without a view in the bundle (older
// bundles), a readable pid or config, it returns none: the dump archives
// them as before.
func maskDumpConf(dir string) (conf, masks []string) {
	if !bundle.HasView(dir) {
		return nil, nil
	}
	s, err := bundle.ReadSpec(dir)
	if err != nil || s.Linux == nil {
		return nil, nil
	}
	pid, err := bundle.ReadPid(bundle.PidFile(dir))
	if err != nil {
		return nil, nil
	}
	mi, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/mountinfo")
	if err != nil {
		return nil, nil
	}
	masks = dirMasks(mi, s.Linux.MaskedPaths)
	for _, m := range masks {
		conf = append(conf, "external mnt["+m+"]:"+maskKey(m))
	}
	return conf, masks
}

// writeMasks records in image img the masks its dump left out.
func writeMasks(img string, masks []string) error {
	if len(masks) == 0 {
		return nil
	}
	if err := os.WriteFile(filepath.Join(img, criuMasks), []byte(strings.Join(masks, "\n")+"\n"), 0o600); err != nil {
		return fmt.Errorf("image: %w", err)
	}
	return nil
}

// maskRestoreConf returns the CRIU options that bind the empty directory of
// the bundle in dir over the masks image img left out.
func maskRestoreConf(dir, img string) ([]string, error) {
	b, err := os.ReadFile(filepath.Join(img, criuMasks))
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	empty, err := bundle.MaskDir(dir)
	if err != nil {
		return nil, fmt.Errorf("image %s leaves its masked directories to the restore: %w", img, err)
	}
	var conf []string
	for m := range strings.Lines(string(b)) {
		m = strings.TrimSpace(m)
		if m == "" {
			continue
		}
		if !validMaskPath(m) {
			return nil, fmt.Errorf("image %s: %s: mask %q is not a plain absolute path", img, criuMasks, m)
		}
		conf = append(conf, "external mnt["+maskKey(m)+"]:"+empty)
	}
	return conf, nil
}
