package volume

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/store"
)

// A write through the content API is a list of named steps, each with a
// crash point (--test-crash-after volume-write/<step>). What it promises,
// also when the server dies at any point: the path holds its old file or
// the whole new one, never a part, and the volume holds nothing else of
// the write (no bytes counted against its size that no file shows).
//
//	step         the body is                             a crash leaves
//	stream body  complete, in an unnamed file (O_TMPFILE) nothing: the kernel frees the file with the process
//	stage        (replace only) linked under a hidden    the old file; Reconcile removes the hidden name,
//	             temporary name, recorded outside the    which the record lists
//	             volume
//	publish      at the path (link, or rename over it)   the new file
//
// A new file is linked at its name in one step, so it needs no stage. A
// directory tree removed through the API (Remove) is not atomic: a crash
// leaves part of it, never a file in part.
const (
	OpWrite            = "volume-write"
	StepWriteStreamed  = "stream body"
	StepWriteStaged    = "stage"
	StepWritePublished = "publish"
)

// WriteSteps lists the crash points of a replacing write, in order, as
// operation and step.
func WriteSteps() [][2]string {
	return [][2]string{{OpWrite, StepWriteStreamed}, {OpWrite, StepWriteStaged}, {OpWrite, StepWritePublished}}
}

// pendingDir is where volume dir's writes in flight are recorded: in the
// server's own directory of the volume, out of every sandbox's reach.
func pendingDir(dir string) string { return filepath.Join(dir, "pending") }

// write is one upload: an unnamed file in the target's directory, which
// gets a name only when it is complete.
type write struct {
	f   *Files
	rel string   // the directory, relative to the volume's root
	dir *os.File // opened through the root: a name swapped for a symlink meanwhile cannot move it
	fd  *os.File
}

// beginWrite opens an unnamed file in directory dir (relative to the root).
func (f *Files) beginWrite(dir string) (*write, error) {
	d, err := f.root.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Openat(int(d.Fd()), ".", unix.O_TMPFILE|unix.O_WRONLY|unix.O_CLOEXEC, 0o600)
	if err != nil {
		d.Close()
		return nil, &fs.PathError{Op: "open", Path: dir, Err: err}
	}
	return &write{f: f, rel: dir, dir: d, fd: os.NewFile(uintptr(fd), "upload")}, nil
}

func (w *write) close() {
	w.fd.Close()
	w.dir.Close()
}

// link gives the unnamed file the name name in its directory; an existing
// name is fs.ErrExist.
func (w *write) link(name string) error {
	err := unix.Linkat(int(w.fd.Fd()), "", int(w.dir.Fd()), name, unix.AT_EMPTY_PATH)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EPERM) {
		// AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH; the /proc link does not.
		err = unix.Linkat(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(int(w.fd.Fd())), int(w.dir.Fd()), name, unix.AT_SYMLINK_FOLLOW)
	}
	if err != nil {
		return &fs.PathError{Op: "link", Path: name, Err: err}
	}
	return nil
}

// publish names the complete file name: a new file in one link (a name
// made meanwhile is a conflict), a replacement through a recorded hidden
// name renamed over the old file.
func (w *write) publish(name string, replace bool) error {
	if !replace {
		if err := w.link(name); err != nil {
			return err
		}
		w.f.crash.After(OpWrite, StepWritePublished)
		return nil
	}
	tmp := "." + name + ".upload-" + newID()[:8]
	rec := filepath.Join(w.f.pending, tmp)
	if err := os.MkdirAll(w.f.pending, 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(rec, []byte(path.Join(w.rel, tmp)), 0o600); err != nil {
		return err
	}
	defer os.Remove(rec)
	if err := w.link(tmp); err != nil {
		return err
	}
	w.f.crash.After(OpWrite, StepWriteStaged)
	if err := unix.Renameat(int(w.dir.Fd()), tmp, int(w.dir.Fd()), name); err != nil {
		_ = unix.Unlinkat(int(w.dir.Fd()), tmp, 0)
		return &fs.PathError{Op: "rename", Path: name, Err: err}
	}
	w.f.crash.After(OpWrite, StepWritePublished)
	return nil
}

// finishWrites removes what replacing writes the last server died in left
// in volume v: the hidden names their records list (a record whose write
// was published names nothing any more). Only a volume with records is
// mounted.
func (s *Service) finishWrites(ctx context.Context, v store.Volume) error {
	pending := pendingDir(s.dir(v.ID))
	recs, err := os.ReadDir(pending)
	if errors.Is(err, fs.ErrNotExist) || (err == nil && len(recs) == 0) {
		return nil
	}
	if err != nil {
		return err
	}
	mnt, err := s.mount(s.dir(v.ID))
	if err != nil {
		return err
	}
	root, err := os.OpenRoot(mnt)
	if err != nil {
		return err
	}
	defer root.Close()
	n, err := removeStaged(root, pending)
	if n > 0 {
		s.log.Warn("removed the staged files of interrupted writes", "volume", v.ID, "files", n)
	}
	if err != nil {
		return fmt.Errorf("volume %s: %w", v.ID, err)
	}
	return nil
}

// removeStaged removes from root the hidden names the records in pending
// list, and the records; it returns how many names it removed.
func removeStaged(root *os.Root, pending string) (int, error) {
	recs, err := os.ReadDir(pending)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for _, r := range recs {
		p := filepath.Join(pending, r.Name())
		b, err := os.ReadFile(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		switch err := root.Remove(string(b)); {
		case err == nil:
			n++
		case !errors.Is(err, fs.ErrNotExist):
			errs = append(errs, fmt.Errorf("remove an interrupted upload: %w", err))
			continue
		}
		errs = append(errs, os.Remove(p))
	}
	return n, errors.Join(errs...)
}
