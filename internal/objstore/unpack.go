package objstore

import (
	"archive/tar"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/untar"
)

// ErrUnsafeImage marks an image tar that Unpack refused: an entry that
// would leave the directory, go through a link, or is not something a
// snapshot holds, or one past its limits (untar.Limits).
var ErrUnsafeImage = errors.New("unsafe image")

// DefaultUnpackLimits hold a sandbox's memory image and writable layer
// (a microVM's disk copies are sparse files of the sandbox's disk size);
// they fill the zero fields of Store.Limits.
func DefaultUnpackLimits() untar.Limits {
	return untar.Limits{
		MaxBytes: 512 << 30, MaxEntryBytes: 256 << 30, MaxEntries: 2_000_000,
		MaxPathBytes: 4096, MaxPathDepth: 256, MaxXattrBytes: 64 << 10,
	}
}

// xattrPrefix is how tar keeps extended attributes in PAX records.
const xattrPrefix = "SCHILY.xattr."

// opaqueXattr marks an overlay upper directory that hides the lower
// layers' one.
const opaqueXattr = "trusted.overlay.opaque"

// Unpack extracts the tar stream r (a snapshot's image directory, as
// PutImage writes it) into dir, an empty directory, as the server: the
// stream is treated as hostile, because its files are what a sandbox
// wrote. It replaces `tar -x -p --same-owner`, which as host root would
// follow what the stream planted. Every entry is made relative to a
// descriptor of its parent directory, which must be a directory an
// earlier entry of the stream made (never a symlink, so none is ever
// followed); names with "..", absolute names and names seen twice are
// refused; hard links point only at regular files of the stream; device
// nodes other than overlay whiteouts (0/0 character devices) are refused;
// owners are numeric, applied with fchown, and modes after them (set-id
// bits kept: the sandbox's id map decides what they mean); extended
// attributes are kept only for user.*, v3 file capabilities and overlay
// opaque markers (the others are dropped); sparse files stay sparse. Anything refused or past lim
// stops the unpack with an error wrapping ErrUnsafeImage that names the
// entry; the caller removes dir.
func Unpack(ctx context.Context, r io.Reader, dir string, lim untar.Limits) error {
	_, err := unpack(ctx, r, dir, lim, false)
	return err
}

// unpack is Unpack; with deferOpaque it leaves the overlay opaque markers
// (trusted.* attributes, which need CAP_SYS_ADMIN) to its caller and
// returns the directories that want one.
func unpack(ctx context.Context, r io.Reader, dir string, lim untar.Limits, deferOpaque bool) ([]string, error) {
	lim = lim.Or(DefaultUnpackLimits())
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("unpack into %s: %w", dir, err)
	}
	defer root.Close()
	u := &unpacker{root: root, lim: lim, seen: map[string]byte{".": tar.TypeDir}, deferOpaque: deferOpaque}
	defer u.closeParent()
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if errors.Is(err, tar.ErrHeader) && u.entries == 0 {
			return nil, fmt.Errorf("the image is not a tar archive (a snapshot image is never compressed): %w: %w", err, ErrUnsafeImage)
		}
		if err != nil {
			return nil, fmt.Errorf("read image tar: %w", err)
		}
		if err := u.entry(hdr, tr); err != nil {
			return nil, err
		}
	}
	// Directory times last: their entries changed them.
	for _, d := range u.dirs {
		if err := u.setTimes(d.name, d.mtime); err != nil {
			return nil, err
		}
	}
	return u.opaque, nil
}

type dirTime struct {
	name  string
	mtime time.Time
}

type unpacker struct {
	root    *os.Root
	lim     untar.Limits
	seen    map[string]byte // entries made, by name: their tar type
	dirs    []dirTime
	entries int
	bytes   int64
	// The open parent directory of the last entry: a stream lists a
	// directory's entries together.
	parentName string
	parent     *os.File
	// deferOpaque collects the directories to mark opaque in opaque.
	deferOpaque bool
	opaque      []string
}

func refuse(name, format string, args ...any) error {
	return fmt.Errorf("image entry %s: %s: %w", quote(name), fmt.Sprintf(format, args...), ErrUnsafeImage)
}

// quote quotes an entry name for a message, cut to 128 bytes.
func quote(p string) string {
	if len(p) > 128 {
		return strconv.Quote(p[:128]) + "…"
	}
	return strconv.Quote(p)
}

// cleanName turns an entry name into a path relative to the directory,
// refusing absolute names and any ".." (the server's tar writes neither).
func cleanName(name string) (string, bool) {
	if strings.HasPrefix(name, "/") || strings.ContainsRune(name, 0) {
		return "", false
	}
	for el := range strings.SplitSeq(name, "/") {
		if el == ".." {
			return "", false
		}
	}
	clean := path.Clean(name)
	if clean == "" || strings.HasPrefix(clean, "../") || clean == ".." {
		return "", false
	}
	return clean, true
}

func (u *unpacker) entry(hdr *tar.Header, tr io.Reader) error {
	u.entries++
	if u.entries > u.lim.MaxEntries {
		return refuse(hdr.Name, "more than %d entries (limit of entries per image)", u.lim.MaxEntries)
	}
	if len(hdr.Name) > u.lim.MaxPathBytes || len(hdr.Linkname) > u.lim.MaxPathBytes {
		return refuse(hdr.Name, "name or link target longer than %d bytes", u.lim.MaxPathBytes)
	}
	name, ok := cleanName(hdr.Name)
	if !ok {
		return refuse(hdr.Name, "absolute names and names with .. leave the image directory")
	}
	if strings.Count(name, "/")+1 > u.lim.MaxPathDepth {
		return refuse(hdr.Name, "more than %d levels deep", u.lim.MaxPathDepth)
	}
	if name == "." {
		return nil // the caller's directory keeps its own owner and mode
	}
	if _, dup := u.seen[name]; dup {
		return refuse(hdr.Name, "listed twice")
	}
	dirName, base := path.Split(name)
	dirName = strings.TrimSuffix(dirName, "/")
	if dirName == "" {
		dirName = "."
	}
	// The parent is a directory of this stream, so resolving it follows
	// no symlink (a symlink entry is never a parent).
	if u.seen[dirName] != tar.TypeDir {
		return refuse(hdr.Name, "its directory %s is not a directory listed before it", quote(dirName))
	}
	pfd, err := u.parentFD(dirName)
	if err != nil {
		return err
	}
	xattrs, err := u.xattrs(hdr)
	if err != nil {
		return err
	}
	perm := uint32(hdr.Mode) & 0o7777
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
			return fmt.Errorf("image entry %s: %w", quote(hdr.Name), err)
		}
		u.dirs = append(u.dirs, dirTime{name, hdr.ModTime})
		if _, ok := xattrs[opaqueXattr]; ok && u.deferOpaque {
			delete(xattrs, opaqueXattr)
			u.opaque = append(u.opaque, name)
		}
		err = u.withFD(pfd, base, unix.O_DIRECTORY, func(fd int) error { return u.meta(fd, hdr, perm, xattrs) })
	case tar.TypeReg, tar.TypeRegA, tar.TypeGNUSparse: //nolint:staticcheck // older tars
		err = u.file(pfd, base, hdr, tr, perm, xattrs)
	case tar.TypeSymlink:
		if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
			return fmt.Errorf("image entry %s: %w", quote(hdr.Name), err)
		}
		err = u.linkMeta(pfd, base, hdr)
	case tar.TypeLink:
		target, ok := cleanName(hdr.Linkname)
		if !ok || u.seen[target] != tar.TypeReg {
			return refuse(hdr.Name, "hard link to %s, which is not a file listed before it", quote(hdr.Linkname))
		}
		err = u.root.Link(target, name)
	case tar.TypeChar:
		// Overlay whiteouts, and nothing else a sandbox can make.
		if hdr.Devmajor != 0 || hdr.Devminor != 0 {
			return refuse(hdr.Name, "device node %d:%d (only 0:0 overlay whiteouts are kept)", hdr.Devmajor, hdr.Devminor)
		}
		if err := unix.Mknodat(pfd, base, unix.S_IFCHR, 0); err != nil {
			return fmt.Errorf("image entry %s: whiteout: %w", quote(hdr.Name), err)
		}
		err = u.linkMeta(pfd, base, hdr)
	case tar.TypeFifo:
		if err := unix.Mknodat(pfd, base, unix.S_IFIFO|0o600, 0); err != nil {
			return fmt.Errorf("image entry %s: %w", quote(hdr.Name), err)
		}
		err = u.withFD(pfd, base, unix.O_NONBLOCK, func(fd int) error { return u.meta(fd, hdr, perm, nil) })
	case tar.TypeBlock:
		return refuse(hdr.Name, "block device %d:%d", hdr.Devmajor, hdr.Devminor)
	default:
		return refuse(hdr.Name, "entry type %q is not part of a snapshot", hdr.Typeflag)
	}
	if err != nil {
		return err
	}
	u.seen[name] = hdr.Typeflag
	if isReg(hdr.Typeflag) {
		u.seen[name] = tar.TypeReg
	}
	return nil
}

// isReg reports whether a tar type is a regular file's: older tars' and
// GNU's old sparse format ('S') too.
func isReg(typ byte) bool {
	return typ == tar.TypeReg || typ == tar.TypeRegA || typ == tar.TypeGNUSparse //nolint:staticcheck // older tars
}

// parentFD opens dir (a directory of the stream) once for its entries.
func (u *unpacker) parentFD(dir string) (int, error) {
	if u.parent != nil && u.parentName == dir {
		return int(u.parent.Fd()), nil
	}
	u.closeParent()
	f, err := u.root.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return -1, fmt.Errorf("image directory %s: %w", quote(dir), err)
	}
	u.parent, u.parentName = f, dir
	return int(f.Fd()), nil
}

func (u *unpacker) closeParent() {
	if u.parent != nil {
		u.parent.Close()
		u.parent = nil
	}
}

// withFD opens base in the directory pfd without following a link.
func (u *unpacker) withFD(pfd int, base string, flags int, f func(fd int) error) error {
	fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|flags, 0)
	if err != nil {
		return fmt.Errorf("image entry %s: %w", quote(base), err)
	}
	defer unix.Close(fd)
	return f(fd)
}

// file writes a regular file's content, holes left as holes.
func (u *unpacker) file(pfd int, base string, hdr *tar.Header, r io.Reader, perm uint32, xattrs map[string]string) error {
	if hdr.Size < 0 || hdr.Size > u.lim.MaxEntryBytes {
		return refuse(hdr.Name, "%d bytes, more than the limit of %d bytes per file", hdr.Size, u.lim.MaxEntryBytes)
	}
	if hdr.Size > u.lim.MaxBytes-u.bytes {
		return refuse(hdr.Name, "%d bytes, past the limit of %d bytes per image", hdr.Size, u.lim.MaxBytes)
	}
	u.bytes += hdr.Size
	fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("image entry %s: %w", quote(hdr.Name), err)
	}
	f := os.NewFile(uintptr(fd), hdr.Name)
	defer f.Close()
	n, err := copySparse(f, io.LimitReader(r, hdr.Size))
	if err != nil {
		return fmt.Errorf("image entry %s: %w", quote(hdr.Name), err)
	}
	if n != hdr.Size {
		return fmt.Errorf("image entry %s: %d of %d bytes: %w", quote(hdr.Name), n, hdr.Size, io.ErrUnexpectedEOF)
	}
	if err := f.Truncate(hdr.Size); err != nil {
		return fmt.Errorf("image entry %s: %w", quote(hdr.Name), err)
	}
	return u.meta(int(f.Fd()), hdr, perm, xattrs)
}

// copySparse copies r to f, seeking over zero blocks instead of writing
// them; the caller sets the final size.
func copySparse(f *os.File, r io.Reader) (int64, error) {
	const block = 4096
	buf := make([]byte, 256<<10)
	var n int64
	for {
		m, err := io.ReadFull(r, buf)
		if m > 0 {
			for off := 0; off < m; off += block {
				b := buf[off:min(off+block, m)]
				if isZero(b) {
					continue
				}
				if _, werr := f.WriteAt(b, n+int64(off)); werr != nil {
					return n, werr
				}
			}
			n += int64(m)
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

func isZero(b []byte) bool {
	for len(b) >= 8 {
		if binary.NativeEndian.Uint64(b) != 0 {
			return false
		}
		b = b[8:]
	}
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// meta applies owner, then mode (chown clears set-id bits), then the
// kept extended attributes (chown clears file capabilities) and times, on
// an open descriptor.
func (u *unpacker) meta(fd int, hdr *tar.Header, perm uint32, xattrs map[string]string) error {
	if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
		return fmt.Errorf("image entry %s: chown: %w", quote(hdr.Name), err)
	}
	if err := unix.Fchmod(fd, perm); err != nil {
		return fmt.Errorf("image entry %s: chmod: %w", quote(hdr.Name), err)
	}
	for k, v := range xattrs {
		if err := unix.Fsetxattr(fd, k, []byte(v), 0); err != nil {
			return fmt.Errorf("image entry %s: xattr %s: %w", quote(hdr.Name), k, err)
		}
	}
	if hdr.Typeflag != tar.TypeDir {
		ts := []unix.Timespec{unix.NsecToTimespec(hdr.ModTime.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
		if err := unix.UtimesNanoAt(fd, "", ts, unix.AT_EMPTY_PATH); err != nil {
			return fmt.Errorf("image entry %s: times: %w", quote(hdr.Name), err)
		}
	}
	return nil
}

// linkMeta sets the owner and times of a symlink or whiteout, which are
// not opened.
func (u *unpacker) linkMeta(pfd int, base string, hdr *tar.Header) error {
	if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("image entry %s: chown: %w", quote(hdr.Name), err)
	}
	ts := []unix.Timespec{unix.NsecToTimespec(hdr.ModTime.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
	if err := unix.UtimesNanoAt(pfd, base, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("image entry %s: times: %w", quote(hdr.Name), err)
	}
	return nil
}

// setTimes sets a directory's times once its entries are in.
func (u *unpacker) setTimes(name string, mtime time.Time) error {
	f, err := u.root.OpenFile(name, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("image directory %s: %w", quote(name), err)
	}
	defer f.Close()
	ts := []unix.Timespec{unix.NsecToTimespec(mtime.UnixNano()), unix.NsecToTimespec(mtime.UnixNano())}
	if err := unix.UtimesNanoAt(int(f.Fd()), "", ts, unix.AT_EMPTY_PATH); err != nil {
		return fmt.Errorf("image directory %s: times: %w", quote(name), err)
	}
	return nil
}

// xattrs are the entry's extended attributes that are kept: user.* (the
// sandbox's own), v3 file capabilities of a root id other than the host's
// (a v2 one, or one of root id 0, would hold on the host; the sandbox's
// user namespace ignores those anyway) and the overlay's opaque marker.
// Other trusted.overlay.* attributes (origin, impure, redirect) point into
// the exporting host's layers and mean nothing here; security labels are
// the host's business. Those are dropped, not refused: a copy-up carries
// a template's own attributes into the writable layer.
func (u *unpacker) xattrs(hdr *tar.Header) (map[string]string, error) {
	var out map[string]string
	total := 0
	settable := isReg(hdr.Typeflag) || hdr.Typeflag == tar.TypeDir
	for k, v := range hdr.PAXRecords {
		name, ok := strings.CutPrefix(k, xattrPrefix)
		if !ok {
			continue
		}
		total += len(name) + len(v)
		if total > u.lim.MaxXattrBytes {
			return nil, refuse(hdr.Name, "extended attributes of more than %d bytes", u.lim.MaxXattrBytes)
		}
		keep := strings.HasPrefix(name, "user.") ||
			(name == opaqueXattr && v == "y") ||
			(name == "security.capability" && nsCapability(v))
		if !keep || !settable {
			continue
		}
		if out == nil {
			out = map[string]string{}
		}
		out[name] = v
	}
	return out, nil
}

// nsCapability reports whether v is a VFS_CAP_REVISION_3 file capability
// whose root id is not the host's root.
func nsCapability(v string) bool {
	const revision3, size3 = 0x03000000, 24
	if len(v) != size3 {
		return false
	}
	b := []byte(v)
	return binary.LittleEndian.Uint32(b[0:4])&0xff000000 == revision3 && binary.LittleEndian.Uint32(b[20:24]) != 0
}
