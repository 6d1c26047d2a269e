package bundle

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/runtime"
)

// Bundle entries of the pause image. The OCI runtime writes into
// CheckpointTmp; the rename to CheckpointDir marks the image complete, so a
// crash mid-dump never leaves something that looks resumable but is not.
const (
	CheckpointDir = "checkpoint"
	CheckpointTmp = "checkpoint.tmp"
	// CRIUWorkDir is CRIU's work dir of a dump, in the bundle.
	CRIUWorkDir = "criu-work"
)

// ImageDir prepares where a checkpoint image is written: opts.ImageDir when
// the caller names one, else the bundle's temporary image dir (own), which
// CommitImage renames into place only once the image is complete.
func (s *Store) ImageDir(id string, opts runtime.CheckpointOptions) (img string, own bool, err error) {
	img, own = opts.ImageDir, opts.ImageDir == ""
	if own {
		img = filepath.Join(s.Dir(id), CheckpointTmp)
		if err := os.RemoveAll(img); err != nil {
			return "", false, err
		}
	}
	if err := os.MkdirAll(img, 0o700); err != nil {
		return "", false, fmt.Errorf("sandbox %s: image dir: %w", id, err)
	}
	return img, own, nil
}

// CommitImage makes a complete image in the bundle the sandbox's pause image.
func CommitImage(dir, img, id string) error {
	if err := os.Rename(img, filepath.Join(dir, CheckpointDir)); err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	syncDir(dir)
	return nil
}

// HasImage reports whether sandbox id has a complete pause image. complete
// says whether dir holds one in the driver's format. A dump interrupted
// after the OCI runtime finished (the server died before the rename) is
// recognised by finished (CRIU's last file, runsc's pages), and finish
// (the driver: its container stopped, whose record it then removes).
func (s *Store) HasImage(ctx context.Context, id string, complete, finished func(dir string) bool, finish func(ctx context.Context) bool) (bool, error) {
	if err := CheckID(id); err != nil {
		return false, err
	}
	dir := s.Dir(id)
	if img := filepath.Join(dir, CheckpointDir); complete(img) || FSOnlyImage(img) {
		return true, nil
	}
	tmp := filepath.Join(dir, CheckpointTmp)
	if !finished(tmp) && !FSOnlyImage(tmp) {
		_ = os.RemoveAll(tmp)
		return false, nil
	}
	if finish(ctx) {
		if err := os.Rename(tmp, filepath.Join(dir, CheckpointDir)); err != nil {
			return false, err
		}
		return true, nil
	}
	_ = os.RemoveAll(tmp)
	return false, nil
}

// DropImage removes the sandbox's pause image.
func (s *Store) DropImage(id string) error {
	if err := CheckID(id); err != nil {
		return err
	}
	dir := s.Dir(id)
	return errors.Join(os.RemoveAll(filepath.Join(dir, CheckpointDir)), os.RemoveAll(filepath.Join(dir, CheckpointTmp)),
		os.RemoveAll(filepath.Join(dir, CRIUWorkDir)))
}

// copyTree copies dir src to dst (which must not exist) with ownership,
// modes, xattrs (overlay opaque markers) and whiteout devices intact.
func copyTree(ctx context.Context, src, dst string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, "cp", "-a", "--reflink=auto", src, dst).CombinedOutput()
	if err != nil {
		return fmt.Errorf("cp %s: %w: %s", src, err, bytes.TrimSpace(out))
	}
	return nil
}

func syncDir(dir string) {
	if f, err := os.Open(dir); err == nil {
		_ = f.Sync()
		f.Close()
	}
}

// CaptureUpper copies the sandbox's writable layer to dest and its log dir
// to dest+".log": envd's log is open in a memory image, so a restore from
// the copy needs the file there.
func (s *Store) CaptureUpper(ctx context.Context, id, dest string) error {
	dir := s.Dir(id)
	upper, _ := LayerDirs(dir, s.DiskMB(id) > 0)
	if err := s.copyUnshifted(ctx, dir, upper, dest); err != nil {
		return fmt.Errorf("sandbox %s: capture writable layer: %w", id, err)
	}
	if err := s.copyUnshifted(ctx, dir, filepath.Join(dir, "log"), dest+".log"); err != nil {
		return fmt.Errorf("sandbox %s: capture log dir: %w", id, err)
	}
	return nil
}

// shiftInto moves the owners of the tree at path (unshifted, or shifted
// into another pool range by an earlier version) into the range at base.
func (s *Store) shiftInto(path string, base uint32) error {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return err
	}
	from, ok := s.uids.rangeOf(st.Uid)
	if !ok {
		from = 0
	}
	if from == base {
		return nil
	}
	return shiftTree(path, from, base, s.cfg.UserNSSize)
}

// copyUnshifted copies src of bundle dir to dst with its owners moved out
// of the sandbox's host id range back to 0.., so the copy (a captured
// writable layer) can be idmapped into any sandbox's range and holds none.
func (s *Store) copyUnshifted(ctx context.Context, dir, src, dst string) error {
	if err := copyTree(ctx, src, dst); err != nil {
		return err
	}
	base, ok := BundleRange(dir)
	if !ok {
		return nil
	}
	if err := shiftTree(dst, base, 0, s.cfg.UserNSSize); err != nil {
		_ = os.RemoveAll(dst)
		return fmt.Errorf("unshift the copy: %w", err)
	}
	return nil
}
