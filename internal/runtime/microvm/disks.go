package microvm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// rootImage returns the ext4 image of layers (lowest first), building it
// on first use. Images are keyed by the layer directories, which the
// template store never changes once built, and shared by every sandbox of
// the template (QEMU opens them read-only).
func (d *Driver) rootImage(ctx context.Context, layers []string) (string, error) {
	if len(layers) == 0 {
		return "", fmt.Errorf("spec.Layers: a template root is required")
	}
	sum := sha256.Sum256([]byte(strings.Join(layers, "\x00")))
	dir := filepath.Join(d.cfg.CacheDir, "roots")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	img := filepath.Join(dir, hex.EncodeToString(sum[:16])+".ext4")
	if _, err := os.Stat(img); err == nil {
		return img, nil
	}
	// One build per image at a time; the others wait and reuse it.
	lock, err := os.OpenFile(img+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return "", err
	}
	if _, err := os.Stat(img); err == nil {
		return img, nil
	}
	src := layers[0]
	if len(layers) > 1 {
		// A read-only overlay of the layers merges them (whiteouts
		// included) into the one tree mkfs copies.
		mnt, err := os.MkdirTemp(dir, ".merge-*")
		if err != nil {
			return "", err
		}
		defer os.Remove(mnt)
		lower := slices.Clone(layers)
		slices.Reverse(lower)
		if err := unix.Mount("overlay", mnt, "overlay", unix.MS_RDONLY, "lowerdir="+strings.Join(lower, ":")); err != nil {
			return "", fmt.Errorf("merge template layers: %w", err)
		}
		defer unix.Unmount(mnt, unix.MNT_DETACH)
		src = mnt
	}
	size, err := treeSize(src)
	if err != nil {
		return "", err
	}
	// Room for ext4's metadata and inodes; the file is sparse.
	mb := size/(1<<20)*5/4 + 256
	tmp := img + ".tmp"
	_ = os.Remove(tmp)
	if err := mkfs(ctx, tmp, mb, src); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, img); err != nil {
		return "", err
	}
	d.log.Info("microvm root image built", "image", img, "layers", len(layers), "mb", mb)
	return img, nil
}

// treeSize sums the sizes of the files under dir.
func treeSize(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if info, err := e.Info(); err == nil {
			n += info.Size() + 4096
		}
		return nil
	})
	return n, err
}

// mkfs makes a sparse ext4 image of mb MiB at path, filled from dir ("" for an empty one).
func mkfs(ctx context.Context, path string, mb int64, dir string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(mb << 20)
	f.Close()
	if err != nil {
		return err
	}
	args := []string{"-q", "-F", "-t", "ext4", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1"}
	if dir != "" {
		args = append(args, "-d", dir)
	}
	out, err := exec.CommandContext(ctx, "mkfs.ext4", append(args, path)...).CombinedOutput()
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("mkfs.ext4 %s: %w: %s", path, err, strings.TrimSpace(string(out)))
	}
	return nil
}
