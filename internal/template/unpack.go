package template

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/untar"
)

// OCI whiteout names (image-spec layer.md).
const (
	whiteoutPrefix = ".wh."
	whiteoutOpaque = ".wh..wh..opq"
)

// unpackStats counts what unpackLayer did, and what it refused.
type unpackStats struct {
	Entries        int
	Whiteouts      int
	SetuidStripped int
	Rejected       []string // entries skipped as unsafe, with the reason
	Bytes          int64    // file content written
	Digest         string   // "sha256:<hex>" of the tar stream (unpackArchive)
	// Opaque are the directories to mark opaque, when the unpacker may
	// not set trusted xattrs itself (the confined one): its caller does.
	Opaque []string `json:",omitempty"`
}

func (u *unpackStats) reject(name, why string) {
	if len(u.Rejected) < 100 {
		u.Rejected = append(u.Rejected, name+": "+why)
	}
}

// unpackLayer extracts one OCI/Docker layer tar into dir, an empty directory
// that becomes an overlay layer. The tar is untrusted:
//   - every path is resolved inside dir with os.Root, so "..", absolute
//     names, and symlinks planted by earlier entries cannot reach outside;
//   - hard links must point inside dir as well;
//   - device nodes, FIFOs and sockets are skipped; setuid/setgid bits and all
//     extended attributes (file capabilities among them) are dropped;
//   - ownership is taken numerically from the headers (names are ignored),
//     since sandboxes share the host's uid space;
//   - whiteouts become overlay whiteouts (0/0 character devices) and opaque
//     markers become the trusted.overlay.opaque xattr, so the layer stacks
//     as an overlay lower dir.
//
// It unpacks within DefaultUnpackLimits.
func unpackLayer(ctx context.Context, r io.Reader, dir string) (unpackStats, error) {
	return unpackArchive(ctx, r, dir, untar.Limits{})
}

// unpackLimited unpacks the tar stream r within lim (defaults applied):
// past a limit it stops with errdefs.ErrTooLarge. archive, if not nil,
// says how many bytes of the archive were received so far, for the ratio
// limit.
//
// deferOpaque leaves the opaque markers to the caller (unpackStats.Opaque).
func unpackLimited(ctx context.Context, r io.Reader, dir string, lim untar.Limits, archive func() int64, deferOpaque bool) (unpackStats, error) {
	lim = lim.Or(DefaultUnpackLimits())
	var st unpackStats
	written := &st.Bytes
	root, err := os.OpenRoot(dir)
	if err != nil {
		return st, err
	}
	defer root.Close()
	tr := tar.NewReader(r)
	type dirTime struct {
		name string
		hdr  *tar.Header
	}
	var dirs []dirTime
	for {
		if err := ctx.Err(); err != nil {
			return st, err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return st, fmt.Errorf("read layer tar: %w", err)
		}
		st.Entries++
		if st.Entries > lim.MaxEntries {
			return st, fmt.Errorf("more than %d entries (limit: %d files unpacked): %w", lim.MaxEntries, lim.MaxEntries, errdefs.ErrTooLarge)
		}
		name, ok := cleanEntryName(hdr.Name)
		if !ok {
			st.reject(hdr.Name, "path leaves the layer")
			continue
		}
		if err := checkPath(lim, "entry", name); err != nil {
			return st, err
		}
		if hdr.Typeflag == tar.TypeSymlink || hdr.Typeflag == tar.TypeLink {
			if err := checkPath(lim, "link target of "+name, hdr.Linkname); err != nil {
				return st, err
			}
		}
		if name == "." {
			continue
		}
		parent, base := path.Split(name)
		parent = strings.TrimSuffix(parent, "/")
		if parent == "" {
			parent = "."
		}
		if parent != "." {
			if err := root.MkdirAll(parent, 0o755); err != nil {
				st.reject(hdr.Name, "parent: "+err.Error())
				continue
			}
		}
		if base == whiteoutOpaque && deferOpaque {
			if err := root.MkdirAll(parent, 0o755); err != nil {
				return st, fmt.Errorf("opaque whiteout %s: %w", hdr.Name, err)
			}
			st.Opaque = append(st.Opaque, parent)
			st.Whiteouts++
			continue
		}
		if base == whiteoutOpaque {
			if err := setOpaque(root, parent); err != nil {
				return st, fmt.Errorf("opaque whiteout %s: %w", hdr.Name, err)
			}
			st.Whiteouts++
			continue
		}
		if victim, ok := strings.CutPrefix(base, whiteoutPrefix); ok {
			if victim == "" || victim == "." || victim == ".." {
				st.reject(hdr.Name, "bad whiteout")
				continue
			}
			target := path.Join(parent, victim)
			if err := root.RemoveAll(target); err != nil {
				st.reject(hdr.Name, err.Error())
				continue
			}
			if err := mknodAt(root, parent, victim, unix.S_IFCHR, 0); err != nil {
				return st, fmt.Errorf("whiteout %s: %w", hdr.Name, err)
			}
			st.Whiteouts++
			continue
		}
		// A later entry replaces an earlier one, except dir over dir.
		if fi, err := root.Lstat(name); err == nil && !(fi.IsDir() && hdr.Typeflag == tar.TypeDir) {
			if err := root.RemoveAll(name); err != nil {
				st.reject(hdr.Name, err.Error())
				continue
			}
		}
		mode := fs.FileMode(hdr.Mode) & (fs.ModePerm | fs.ModeSticky)
		if hdr.Mode&0o6000 != 0 {
			st.SetuidStripped++
		}
		if hdr.Mode&0o1000 != 0 {
			mode |= fs.ModeSticky
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := root.Mkdir(name, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
				st.reject(hdr.Name, err.Error())
				continue
			}
			dirs = append(dirs, dirTime{name, hdr})
		case tar.TypeReg, tar.TypeRegA: //nolint:staticcheck // old tars use TypeRegA
			// The declared size (a sparse entry's holes included) must fit
			// before anything is written.
			if hdr.Size > lim.MaxEntryBytes {
				return st, fmt.Errorf("%s declares %d bytes, more than the limit of %s per file: %w",
					shortName(name), hdr.Size, sizeName(lim.MaxEntryBytes), errdefs.ErrTooLarge)
			}
			if hdr.Size > lim.MaxBytes-*written {
				return st, fmt.Errorf("%s declares %d bytes, more than the %d bytes left of the limit of %s unpacked: %w",
					shortName(name), hdr.Size, lim.MaxBytes-*written, sizeName(lim.MaxBytes), errdefs.ErrTooLarge)
			}
			f, err := root.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
			if err != nil {
				st.reject(hdr.Name, err.Error())
				continue
			}
			_, err = io.Copy(&limitedWriter{w: f, name: name, written: written, archive: archive, lim: lim}, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if errors.Is(err, errdefs.ErrTooLarge) {
				return st, err
			}
			if err != nil {
				return st, fmt.Errorf("write %s: %w", hdr.Name, err)
			}
		case tar.TypeSymlink:
			if err := root.Symlink(hdr.Linkname, name); err != nil {
				st.reject(hdr.Name, err.Error())
				continue
			}
		case tar.TypeLink:
			target, ok := cleanEntryName(hdr.Linkname)
			if !ok || target == "." {
				st.reject(hdr.Name, "hard link target leaves the layer")
				continue
			}
			if fi, err := root.Lstat(target); err != nil || fi.IsDir() {
				st.reject(hdr.Name, "hard link target not in this layer")
				continue
			}
			if err := root.Link(target, name); err != nil {
				st.reject(hdr.Name, err.Error())
			}
			continue // shares the target's inode: no owner or mode of its own
		case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
			st.reject(hdr.Name, "device nodes and FIFOs are not allowed")
			continue
		default:
			st.reject(hdr.Name, fmt.Sprintf("unsupported entry type %q", hdr.Typeflag))
			continue
		}
		if err := root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
			return st, fmt.Errorf("chown %s: %w", hdr.Name, err)
		}
		if hdr.Typeflag == tar.TypeSymlink {
			continue
		}
		// After chown, which clears set-id bits anyway.
		if err := root.Chmod(name, mode); err != nil {
			return st, fmt.Errorf("chmod %s: %w", hdr.Name, err)
		}
		if hdr.Typeflag != tar.TypeDir {
			_ = root.Chtimes(name, hdr.ModTime, hdr.ModTime)
		}
	}
	// Directory times last: creating entries inside changed them.
	for _, d := range dirs {
		_ = root.Chtimes(d.name, d.hdr.ModTime, d.hdr.ModTime)
	}
	return st, nil
}

// cleanEntryName turns a tar entry name into a path relative to the layer
// root, refusing any that climb out of it.
func cleanEntryName(name string) (string, bool) {
	name = strings.TrimPrefix(strings.ReplaceAll(name, "\\", "/"), "./")
	for _, el := range strings.Split(name, "/") {
		if el == ".." {
			return "", false
		}
	}
	if strings.ContainsRune(name, 0) {
		return "", false
	}
	clean := strings.TrimPrefix(path.Clean("/"+name), "/")
	if clean == "" {
		clean = "."
	}
	return clean, true
}

// setOpaque marks dir (relative to root) opaque for overlayfs.
func setOpaque(root *os.Root, dir string) error {
	if err := root.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := root.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Fsetxattr(int(f.Fd()), "trusted.overlay.opaque", []byte("y"), 0)
}

// mknodAt makes a device node name in dir (relative to root) through the
// dir's file descriptor, so the node lands inside root.
func mknodAt(root *os.Root, dir, name string, mode uint32, dev int) error {
	f, err := root.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Mknodat(int(f.Fd()), name, mode, dev)
}
