package microvm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/confine"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// rootImage returns the ext4 image of layers (lowest first), building it
// on first use for sandbox id. Images are keyed by the layer directories,
// which the template store never changes once built, and shared by every
// sandbox of the template (QEMU opens them read-only).
func (d *Driver) rootImage(ctx context.Context, id string, layers []string) (string, error) {
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
	size, err := treeSize(src, maxRootBytes)
	if err != nil {
		return "", err
	}
	// Room for ext4's metadata and inodes; the file is sparse.
	mb := size/(1<<20)*5/4 + 256
	tmp := img + ".tmp"
	_ = os.Remove(tmp)
	if err := d.mkfsTree(ctx, id, tmp, mb, src); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, img); err != nil {
		return "", err
	}
	d.log.Info("microvm root image built", "image", img, "layers", len(layers), "mb", mb)
	return img, nil
}

// maxRootBytes bounds the template tree a root image holds: the image
// is as big as the tree, so an oversized one is refused before mkfs.
const maxRootBytes = 64 << 30

// treeSize sums the sizes of the files under dir (symlinks not
// followed), refusing a tree past limit.
func treeSize(dir string, limit int64) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if info, err := e.Info(); err == nil {
			n += info.Size() + 4096
		}
		if n > limit {
			return fmt.Errorf("the template's files take more than %d GiB, the limit of a microVM root image: %w", limit>>30, errdefs.ErrTooLarge)
		}
		return nil
	})
	return n, err
}

// mkfsArgs make an ext4 file system with no reserved blocks, its inode
// tables and journal initialised lazily (the file stays sparse).
var mkfsArgs = []string{"-q", "-F", "-t", "ext4", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1"}

// mkfs makes a sparse ext4 image of mb MiB at path, filled from dir ("" for
// an empty one). dir is the server's own writing (a guest's settings): a
// template's tree goes through mkfsTree.
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
	args := slices.Clone(mkfsArgs)
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

// mkfsTree makes the ext4 image of mb MiB at path from a template's tree.
// A build input wrote that tree (names, links, attributes, sizes), so
// mkfs.ext4 reads it inside internal/confine as sandbox id's unprivileged
// uid: no network, no new process, limits, seccomp, Landlock (the system
// dirs and the tree read-only, the image the only thing it writes) and
// CAP_DAC_READ_SEARCH as its only capability, to read files of every
// owner. It never writes more than the image's size.
func (d *Driver) mkfsTree(ctx context.Context, id, path string, mb int64, dir string) error {
	if d.cfg.HookBinary == "" {
		return errors.New("microvm: Config.HookBinary is required to build a root image")
	}
	uid, err := d.sandboxUID(id)
	if err != nil {
		return err
	}
	tree, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer tree.Close()
	img, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	defer img.Close()
	ok := false
	defer func() {
		if !ok {
			os.Remove(path)
		}
	}()
	if err := img.Truncate(mb << 20); err != nil {
		return err
	}
	// mkfs reopens the image by /proc/self/fd, which checks its owner: the
	// sandbox's uid's while it runs, root's again after.
	if err := img.Chown(uid, uid); err != nil {
		return err
	}
	defer img.Chown(0, 0)
	tool, err := MkfsTool(d.cfg.HookBinary, uid, img, tree, mb)
	if err != nil {
		return err
	}
	out, err := tool.Run(ctx)
	if err != nil {
		return fmt.Errorf("mkfs.ext4 of the template's files: %w: %s", err, confine.Output(out))
	}
	if err := img.Chown(0, 0); err != nil {
		return err
	}
	ok = true
	return nil
}

// MkfsTool is the confined run of mkfs.ext4 that fills img (mb MiB, owned
// by uid) from tree: tree read-only, img the only file written, never
// past its size, as uid with CAP_DAC_READ_SEARCH alone.
func MkfsTool(self string, uid int, img, tree *os.File, mb int64) (confine.Tool, error) {
	bin, err := exec.LookPath("mkfs.ext4")
	if err != nil {
		return confine.Tool{}, err
	}
	return confine.Tool{
		Self: self, UID: uid, GID: uid,
		Argv:  append(append([]string{bin}, mkfsArgs...), "-d", confine.FD(1), confine.FD(0)),
		Files: []*os.File{img}, Dirs: []*os.File{tree}, ReadAll: true,
		Limits: confine.Limits{FileSize: uint64(mb << 20), CPUSeconds: 1800, AddressSpace: 4 << 30, Files: 256},
	}, nil
}
