package volume

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/crashpoint"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// Files is one volume's file tree as the content API sees it. Every path
// is resolved inside the volume's root (os.Root): "..", absolute symlinks
// and symlinks that lead above the root are refused however they are
// combined, also when code in a sandbox swaps directories for symlinks
// while a call runs. The server works on the volume as host root, so owners
// and modes are exactly what the caller asks for; ids are the ones sandboxes
// see (0..MaxID).
type Files struct {
	root   *os.Root
	sizeMB int
	disk   DiskGuard // nil: the host disk is not guarded
	// pending is the server-private directory (outside the volume) that
	// records replacements in flight (writesteps.go).
	pending string
	crash   crashpoint.Switch
}

// Close releases the tree.
func (f *Files) Close() error { return f.root.Close() }

// MaxID is the largest uid or gid a file of a volume can have: the ids a
// sandbox has.
const MaxID = 65535

// MaxDepth is the deepest listing.
const MaxDepth = 32

// File types of an Entry (E2B's names).
const (
	TypeFile      = "file"
	TypeDirectory = "directory"
	TypeSymlink   = "symlink"
	TypeUnknown   = "unknown"
)

// Entry describes one path of a volume (E2B's VolumeEntryStat).
type Entry struct {
	Name   string
	Type   string
	Path   string // absolute inside the volume
	Size   int64
	Mode   uint32 // permission, set-id and sticky bits
	UID    uint32
	GID    uint32
	Atime  time.Time
	Mtime  time.Time
	Ctime  time.Time
	Target string // a symlink's target
}

// Meta is what a caller sets on a path; nil fields are left alone (or take
// the defaults on creation: owner 0:0, mode 0644 for files, 0755 for
// directories).
type Meta struct {
	UID, GID, Mode *uint32
}

// Check returns an errdefs.ErrInvalidArgument error naming the field that
// is out of range.
func (m Meta) Check() error {
	for _, f := range []struct {
		name string
		v    *uint32
		max  uint32
	}{{"uid", m.UID, MaxID}, {"gid", m.GID, MaxID}, {"mode", m.Mode, 0o7777}} {
		if f.v != nil && *f.v > f.max {
			return fmt.Errorf("%s: %d is out of range (0 to %d): %w", f.name, *f.v, f.max, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// rel turns an API path ("/a/b", "a/b", "/") into a path relative to the
// root ("a/b", "."), its cleaned absolute form, or an error naming it.
func rel(p string) (string, string, error) {
	if p == "" {
		return "", "", fmt.Errorf("path: required, e.g. /file.txt: %w", errdefs.ErrInvalidArgument)
	}
	if len(p) > 4096 || strings.ContainsRune(p, 0) {
		return "", "", fmt.Errorf("path: must be at most 4096 bytes without NUL: %w", errdefs.ErrInvalidArgument)
	}
	abs := path.Clean("/" + p)
	r := strings.TrimPrefix(abs, "/")
	if r == "" {
		r = "."
	}
	return r, abs, nil
}

// fail maps a file-system error on path p to the error vocabulary.
func (f *Files) fail(p string, err error) error {
	var errno syscall.Errno
	errors.As(err, &errno)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("path %s not found: %w", p, errdefs.ErrNotFound)
	case errors.Is(err, fs.ErrExist):
		return fmt.Errorf("path %s already exists: %w", p, errdefs.ErrConflict)
	case strings.Contains(err.Error(), "path escapes from parent"):
		return fmt.Errorf("path %s leads out of the volume (through \"..\" or a symlink that is absolute or goes above the volume's root): %w", p, errdefs.ErrInvalidArgument)
	case errno == unix.ENOTDIR:
		return fmt.Errorf("path %s: a parent of it is not a directory: %w", p, errdefs.ErrInvalidArgument)
	case errno == unix.EISDIR:
		return fmt.Errorf("path %s is a directory: %w", p, errdefs.ErrInvalidArgument)
	case errno == unix.ENAMETOOLONG:
		return fmt.Errorf("path %s: a name in it is too long: %w", p, errdefs.ErrInvalidArgument)
	case errno == unix.ENOTEMPTY:
		return fmt.Errorf("path %s: directory not empty: %w", p, errdefs.ErrConflict)
	case errno == unix.ENOSPC || errno == unix.EDQUOT:
		return fmt.Errorf("the volume is full (its size is %d MiB): %w", f.sizeMB, errdefs.ErrNoSpace)
	case errno == unix.ELOOP:
		return fmt.Errorf("path %s: too many symlinks: %w", p, errdefs.ErrInvalidArgument)
	}
	return fmt.Errorf("path %s: %w", p, err)
}

// entry describes r (relative) whose cleaned absolute form is abs.
func (f *Files) entry(r, abs string, fi fs.FileInfo) Entry {
	e := Entry{Name: path.Base(abs), Path: abs, Size: fi.Size(), Mtime: fi.ModTime().UTC(), Type: TypeUnknown}
	if abs == "/" {
		e.Name = "/"
	}
	switch {
	case fi.Mode().IsRegular():
		e.Type = TypeFile
	case fi.IsDir():
		e.Type = TypeDirectory
	case fi.Mode()&fs.ModeSymlink != 0:
		e.Type = TypeSymlink
		e.Target, _ = f.root.Readlink(r)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.Mode = st.Mode & 0o7777
		e.UID, e.GID = st.Uid, st.Gid
		e.Atime = time.Unix(st.Atim.Unix()).UTC()
		e.Ctime = time.Unix(st.Ctim.Unix()).UTC()
	}
	return e
}

// Stat describes path p (a symlink itself, not its target).
func (f *Files) Stat(p string) (Entry, error) {
	r, abs, err := rel(p)
	if err != nil {
		return Entry{}, err
	}
	fi, err := f.root.Lstat(r)
	if err != nil {
		return Entry{}, f.fail(abs, err)
	}
	return f.entry(r, abs, fi), nil
}

// List calls emit with every entry under directory p, depth levels deep
// (1: its children), parents before their children. It reads directories
// in batches, so a large directory costs no more memory than a small one.
func (f *Files) List(p string, depth int, emit func(Entry) error) error {
	if depth < 1 || depth > MaxDepth {
		return fmt.Errorf("depth: must be 1 to %d: %w", MaxDepth, errdefs.ErrInvalidArgument)
	}
	r, abs, err := rel(p)
	if err != nil {
		return err
	}
	fi, err := f.root.Stat(r)
	if err != nil {
		return f.fail(abs, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("path %s is not a directory: %w", abs, errdefs.ErrInvalidArgument)
	}
	return f.list(r, abs, depth, emit)
}

func (f *Files) list(r, abs string, depth int, emit func(Entry) error) error {
	d, err := f.root.OpenFile(r, os.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return f.fail(abs, err)
	}
	defer d.Close()
	for {
		ents, err := d.ReadDir(256)
		for _, de := range ents {
			cr, cabs := path.Join(r, de.Name()), path.Join(abs, de.Name())
			// Lstat through the root, never de.Info(): that one looks the
			// name up by path from the working directory.
			fi, err := f.root.Lstat(cr)
			if errors.Is(err, fs.ErrNotExist) {
				continue // removed meanwhile
			}
			if err != nil {
				return f.fail(cabs, err)
			}
			if err := emit(f.entry(cr, cabs, fi)); err != nil {
				return err
			}
			if fi.IsDir() && depth > 1 {
				if err := f.list(cr, cabs, depth-1, emit); err != nil {
					return err
				}
			}
		}
		if errors.Is(err, io.EOF) || (err == nil && len(ents) == 0) {
			return nil
		}
		if err != nil {
			return f.fail(abs, err)
		}
	}
}

// setMeta applies m to the open file or directory fd (never following a
// symlink: fd was opened with O_NOFOLLOW).
func setMeta(fd *os.File, m Meta) error {
	if m.UID != nil || m.GID != nil {
		uid, gid := -1, -1
		if m.UID != nil {
			uid = int(*m.UID)
		}
		if m.GID != nil {
			gid = int(*m.GID)
		}
		if err := fd.Chown(uid, gid); err != nil {
			return err
		}
	}
	if m.Mode != nil {
		if err := fd.Chmod(fs.FileMode(*m.Mode&0o777) | unixModeBits(*m.Mode)); err != nil {
			return err
		}
	}
	return nil
}

// unixModeBits converts set-id and sticky bits to Go's FileMode bits.
func unixModeBits(m uint32) fs.FileMode {
	var out fs.FileMode
	if m&unix.S_ISUID != 0 {
		out |= fs.ModeSetuid
	}
	if m&unix.S_ISGID != 0 {
		out |= fs.ModeSetgid
	}
	if m&unix.S_ISVTX != 0 {
		out |= fs.ModeSticky
	}
	return out
}

// withDefaults fills the unset fields of m with the owner 0:0 and mode.
func withDefaults(m Meta, mode uint32) Meta {
	zero := uint32(0)
	if m.UID == nil {
		m.UID = &zero
	}
	if m.GID == nil {
		m.GID = &zero
	}
	if m.Mode == nil {
		m.Mode = &mode
	}
	return m
}

// MakeDir creates directory p with m. An existing path is a conflict
// unless force is set and it is a directory (then it is returned as it
// is). With force missing parents are created too, with m.
func (f *Files) MakeDir(p string, m Meta, force bool) (Entry, error) {
	if err := m.Check(); err != nil {
		return Entry{}, err
	}
	r, abs, err := rel(p)
	if err != nil {
		return Entry{}, err
	}
	m = withDefaults(m, 0o755)
	if fi, err := f.root.Lstat(r); err == nil {
		if force && fi.IsDir() {
			return f.entry(r, abs, fi), nil
		}
		return Entry{}, fmt.Errorf("path %s already exists: %w", abs, errdefs.ErrConflict)
	}
	parts := strings.Split(r, "/")
	for i := range parts {
		cr := strings.Join(parts[:i+1], "/")
		last := i == len(parts)-1
		if !last {
			fi, err := f.root.Lstat(cr)
			if err == nil {
				if !fi.IsDir() {
					return Entry{}, fmt.Errorf("path /%s is not a directory: %w", cr, errdefs.ErrConflict)
				}
				continue
			}
			if !errors.Is(err, fs.ErrNotExist) {
				return Entry{}, f.fail("/"+cr, err)
			}
			if !force {
				return Entry{}, fmt.Errorf("path /%s not found (pass force to create parents): %w", cr, errdefs.ErrNotFound)
			}
		}
		if err := f.root.Mkdir(cr, 0o700); err != nil {
			if errors.Is(err, fs.ErrExist) && !last {
				continue
			}
			return Entry{}, f.fail("/"+cr, err)
		}
		d, err := f.root.OpenFile(cr, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
		if err != nil {
			return Entry{}, f.fail("/"+cr, err)
		}
		err = setMeta(d, m)
		d.Close()
		if err != nil {
			return Entry{}, f.fail("/"+cr, err)
		}
	}
	return f.Stat(abs)
}

// Open opens regular file p for reading. A directory, FIFO, socket or
// device is refused (a FIFO would block the reader).
func (f *Files) Open(p string) (*os.File, Entry, error) {
	r, abs, err := rel(p)
	if err != nil {
		return nil, Entry{}, err
	}
	fd, err := f.root.OpenFile(r, os.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, Entry{}, f.fail(abs, err)
	}
	fi, err := fd.Stat()
	if err != nil {
		fd.Close()
		return nil, Entry{}, f.fail(abs, err)
	}
	if !fi.Mode().IsRegular() {
		fd.Close()
		if fi.IsDir() {
			return nil, Entry{}, fmt.Errorf("path %s is a directory; list it with GET /volumecontent/{volumeID}/dir: %w", abs, errdefs.ErrInvalidArgument)
		}
		return nil, Entry{}, fmt.Errorf("path %s is not a regular file: %w", abs, errdefs.ErrInvalidArgument)
	}
	return fd, f.entry(r, abs, fi), nil
}

// Write writes body to file p with m, streaming. The write is atomic, also
// across a crash of the server: p holds the old file or the whole new one,
// never a part (writesteps.go). An existing file is a conflict unless force
// is set; then it is replaced at once when the body is complete. The parent
// directory must exist. A volume that fills up fails with ErrNoSpace and
// keeps nothing of the upload.
func (f *Files) Write(p string, body io.Reader, m Meta, force bool) (Entry, error) {
	if err := m.Check(); err != nil {
		return Entry{}, err
	}
	if err := f.admitDisk(); err != nil {
		return Entry{}, err
	}
	r, abs, err := rel(p)
	if err != nil {
		return Entry{}, err
	}
	if r == "." {
		return Entry{}, fmt.Errorf("path / is the volume's root directory: %w", errdefs.ErrInvalidArgument)
	}
	m = withDefaults(m, 0o644)
	dir, name := path.Split(r)
	dir = strings.TrimSuffix(dir, "/")
	if dir == "" {
		dir = "."
	}
	if fi, err := f.root.Stat(dir); err != nil {
		return Entry{}, f.fail(path.Dir(abs), err)
	} else if !fi.IsDir() {
		return Entry{}, fmt.Errorf("path %s is not a directory: %w", path.Dir(abs), errdefs.ErrInvalidArgument)
	}
	if fi, err := f.root.Lstat(r); err == nil {
		if fi.IsDir() {
			return Entry{}, fmt.Errorf("path %s is a directory: %w", abs, errdefs.ErrConflict)
		}
		if !force {
			return Entry{}, fmt.Errorf("path %s already exists; pass force to overwrite it: %w", abs, errdefs.ErrConflict)
		}
	}
	w, err := f.beginWrite(dir)
	if err != nil {
		return Entry{}, f.fail(abs, err)
	}
	defer w.close()
	if _, err := io.Copy(w.fd, body); err != nil {
		var errno syscall.Errno
		if errors.As(err, &errno) || errors.Is(err, fs.ErrClosed) {
			return Entry{}, f.fail(abs, err)
		}
		return Entry{}, fmt.Errorf("upload of %s cut off: %v: %w", abs, err, errdefs.ErrInvalidArgument)
	}
	if err := setMeta(w.fd, m); err != nil {
		return Entry{}, f.fail(abs, err)
	}
	f.crash.After(OpWrite, StepWriteStreamed)
	if err := w.publish(name, force); err != nil {
		return Entry{}, f.fail(abs, err)
	}
	return f.Stat(abs)
}

// Remove removes path p, a directory with everything in it. The root is
// refused.
func (f *Files) Remove(p string) error {
	r, abs, err := rel(p)
	if err != nil {
		return err
	}
	if r == "." {
		return fmt.Errorf("path / is the volume's root and cannot be removed (delete the volume with DELETE /volumes/{volumeID}): %w", errdefs.ErrInvalidArgument)
	}
	if _, err := f.root.Lstat(r); err != nil {
		return f.fail(abs, err)
	}
	if err := f.root.RemoveAll(r); err != nil {
		return f.fail(abs, err)
	}
	return nil
}

// SetMeta changes the owner and mode of path p (of a symlink itself its
// owner only).
func (f *Files) SetMeta(p string, m Meta) (Entry, error) {
	if err := m.Check(); err != nil {
		return Entry{}, err
	}
	r, abs, err := rel(p)
	if err != nil {
		return Entry{}, err
	}
	fi, err := f.root.Lstat(r)
	if err != nil {
		return Entry{}, f.fail(abs, err)
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		if m.Mode != nil {
			return Entry{}, fmt.Errorf("mode: path %s is a symlink, which has no mode of its own: %w", abs, errdefs.ErrInvalidArgument)
		}
		uid, gid := -1, -1
		if m.UID != nil {
			uid = int(*m.UID)
		}
		if m.GID != nil {
			gid = int(*m.GID)
		}
		if err := f.root.Lchown(r, uid, gid); err != nil {
			return Entry{}, f.fail(abs, err)
		}
		return f.Stat(abs)
	}
	fd, err := f.root.OpenFile(r, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return Entry{}, f.fail(abs, err)
	}
	err = setMeta(fd, m)
	fd.Close()
	if err != nil {
		return Entry{}, f.fail(abs, err)
	}
	return f.Stat(abs)
}
