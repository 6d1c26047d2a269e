package bundle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// The writable layer of a sandbox with a disk limit lives on its own ext4
// filesystem: a sparse image file on a loop device, mounted at <bundle>/disk
// and holding the overlay's upper and work dirs. A full disk then fails
// with ENOSPC inside that sandbox only; the host's filesystem never fills.
//
// Formatting a filesystem per sandbox would cost ~100 ms, so one empty image
// per size is formatted once (diskImageDir) and each sandbox gets a sparse
// copy of it, which takes a few milliseconds and almost no space.

// diskDirName is the mount point of the sandbox's disk in its bundle.
const diskDirName = "disk"

// LayerDirs returns the overlay upper and work dirs of bundle dir: on the
// sandbox's own disk when it has one.
func LayerDirs(dir string, onDisk bool) (upper, work string) {
	if onDisk {
		return filepath.Join(dir, diskDirName, "upper"), filepath.Join(dir, diskDirName, "work")
	}
	return filepath.Join(dir, "upper"), filepath.Join(dir, "work")
}

// diskImageName names the formatted empty image of mb MiB. The suffix is
// the format's version: an image of an earlier format is left for a new
// one (and removed once that is made).
func diskImageName(mb int, version string) string {
	return "ext4-" + strconv.Itoa(mb) + "m" + version + ".img"
}

// diskImageVersion is the current format's suffix: "-layers", without
// the reserved GDT blocks of online growth (resize_inode), which no sandbox
// disk ever does (they were 4 MiB of data in each sandbox's copy of a
// 10 GiB image, and now it is about 200 KiB), and with the overlay's upper
// and work dirs made and lost+found removed at format time, so a create
// writes no directory blocks into its fresh disk.
const diskImageVersion = "-layers"

// diskImageOldVersions are the suffixes of earlier formats, removed once
// the current one is made.
var diskImageOldVersions = [...]string{"", "-noresize"}

// diskImage returns the path of the formatted empty image of mb MiB,
// formatting it the first time.
func (s *Store) diskImage(ctx context.Context, mb int) (string, error) {
	path := filepath.Join(s.cfg.DiskImageDir, diskImageName(mb, diskImageVersion))
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	if err := os.MkdirAll(s.cfg.DiskImageDir, 0o700); err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(s.cfg.DiskImageDir, ".format-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Truncate(int64(mb) << 20); err != nil {
		tmp.Close()
		return "", err
	}
	tmp.Close()
	// No journal: the layer is scratch space that does not outlive a host
	// crash anyway. No reserved blocks: the sandbox's root gets all of it.
	// Inode tables are zeroed now so no lazy-init thread writes into every
	// sandbox's copy later.
	out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal,^resize_inode",
		"-E", "lazy_itable_init=0,lazy_journal_init=0,root_owner=0:0", tmp.Name()).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("format %d MiB disk image: %w: %s", mb, err, out)
	}
	if err := prepareLayerDirs(tmp.Name()); err != nil {
		return "", fmt.Errorf("format %d MiB disk image: %w", mb, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return "", err
	}
	for _, v := range diskImageOldVersions {
		_ = os.Remove(filepath.Join(s.cfg.DiskImageDir, diskImageName(mb, v)))
	}
	return path, nil
}

// prepareLayerDirs mounts the freshly formatted image file, makes the
// overlay's upper and work dirs on it and removes lost+found (which would
// show up in the sandbox's / through the upper dir), once per image
// instead of once per sandbox.
func prepareLayerDirs(file string) error {
	mnt, err := os.MkdirTemp(filepath.Dir(file), ".mnt-*")
	if err != nil {
		return err
	}
	defer os.Remove(mnt)
	dev, f, err := attachLoop(file)
	if err != nil {
		return err
	}
	err = unix.Mount(dev, mnt, "ext4", unix.MS_NOSUID|unix.MS_NODEV, "")
	f.Close()
	if err != nil {
		return fmt.Errorf("mount %s: %w", dev, err)
	}
	for _, sub := range []string{"upper", "work"} {
		if err = os.Mkdir(filepath.Join(mnt, sub), 0o755); err != nil {
			break
		}
	}
	if err == nil {
		err = os.Remove(filepath.Join(mnt, "lost+found"))
	}
	if uerr := Unmount(mnt); err == nil {
		err = uerr
	}
	return err
}

// sparseCopy copies src to dst, keeping holes as holes.
func sparseCopy(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	if err := out.Truncate(fi.Size()); err != nil {
		return err
	}
	size := fi.Size()
	var off int64
	for off < size {
		data, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return fmt.Errorf("seek data: %w", err)
		}
		hole, err := unix.Seek(int(in.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seek hole: %w", err)
		}
		if _, err := in.Seek(data, io.SeekStart); err != nil {
			return err
		}
		if _, err := out.Seek(data, io.SeekStart); err != nil {
			return err
		}
		if _, err := io.CopyN(out, in, hole-data); err != nil {
			return fmt.Errorf("copy extent: %w", err)
		}
		off = hole
	}
	return out.Close()
}

// attachLoop binds file to a free loop device that detaches itself once
// its last user (the mount) is gone. It returns the device path and an
// open handle the caller must close after mounting.
func attachLoop(file string) (string, *os.File, error) {
	backing, err := os.OpenFile(file, os.O_RDWR, 0)
	if err != nil {
		return "", nil, err
	}
	defer backing.Close()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return "", nil, fmt.Errorf("loop devices: %w", err)
	}
	defer ctl.Close()
	for range 50 {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", nil, fmt.Errorf("find free loop device: %w", err)
		}
		dev := "/dev/loop" + strconv.Itoa(n)
		f, err := os.OpenFile(dev, os.O_RDWR, 0)
		if err != nil {
			return "", nil, fmt.Errorf("open %s: %w", dev, err)
		}
		cfg := unix.LoopConfig{Fd: uint32(backing.Fd())}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
		err = unix.IoctlLoopConfigure(int(f.Fd()), &cfg)
		if err == nil {
			return dev, f, nil
		}
		f.Close()
		if !errors.Is(err, unix.EBUSY) {
			return "", nil, fmt.Errorf("configure %s: %w", dev, err)
		}
		// Another process took this device between GET_FREE and CONFIGURE.
		time.Sleep(time.Millisecond)
	}
	return "", nil, errors.New("no free loop device after 50 tries")
}

// mountDisk gives bundle dir its own ext4 disk of mb MiB at <dir>/disk with
// the overlay's upper and work dirs on it.
func (s *Store) mountDisk(ctx context.Context, dir string, mb int) error {
	mnt := filepath.Join(dir, diskDirName)
	if d, ok := s.disks.take(mb); ok {
		err := attachPooledDisk(d, dir)
		if err == nil {
			return finishDisk(mnt)
		}
		s.log.Warn("disk pool: attaching a ready disk failed; making one", "err", err)
	}
	img, err := s.diskImage(ctx, mb)
	if err != nil {
		return err
	}
	file := filepath.Join(dir, "disk.img")
	if err := sparseCopy(img, file); err != nil {
		return fmt.Errorf("copy disk image: %w", err)
	}
	if err := os.Mkdir(mnt, 0o755); err != nil {
		return err
	}
	dev, f, err := attachLoop(file)
	if err != nil {
		return err
	}
	err = unix.Mount(dev, mnt, "ext4", unix.MS_NOSUID|unix.MS_NODEV, "")
	f.Close() // the mount holds the device now; autoclear frees it at unmount
	if err != nil {
		return fmt.Errorf("mount %s: %w", dev, err)
	}
	return finishDisk(mnt)
}

// finishDisk makes sure the sandbox's freshly mounted disk at mnt has the
// overlay's dirs and no lost+found.
func finishDisk(mnt string) error {
	// The image has the dirs already (prepareLayerDirs); an image made
	// by hand without them still works, at the cost of the writes.
	for _, sub := range []string{"upper", "work"} {
		if err := os.Mkdir(filepath.Join(mnt, sub), 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			_ = Unmount(mnt)
			return err
		}
	}
	if err := os.Remove(filepath.Join(mnt, "lost+found")); err != nil && !errors.Is(err, fs.ErrNotExist) {
		_ = Unmount(mnt)
		return fmt.Errorf("remove lost+found from the disk: %w", err)
	}
	return nil
}

// unmountDisk unmounts the sandbox's disk if it has one.
func unmountDisk(dir string) error {
	return Unmount(filepath.Join(dir, diskDirName))
}

// diskUsageStatfs reports used and total bytes of the sandbox's own disk;
// ok is false when the sandbox has none.
func diskUsageStatfs(dir string) (used, total uint64, ok bool) {
	mnt := filepath.Join(dir, diskDirName)
	var st, parent unix.Statfs_t
	if unix.Statfs(mnt, &st) != nil || unix.Statfs(dir, &parent) != nil || st.Fsid == parent.Fsid {
		return 0, 0, false
	}
	total = st.Blocks * uint64(st.Bsize)
	// Bavail, not Bfree: ext4 keeps a few MiB (reserved clusters) that no
	// write gets, so a full disk still has them free.
	return total - min(st.Bavail, st.Blocks)*uint64(st.Bsize), total, true
}

// AttachLoop binds file to a free loop device that detaches itself once
// its last user is gone (a mount of it, or the returned handle). The
// caller closes the handle once the device is mounted.
func AttachLoop(file string) (string, *os.File, error) { return attachLoop(file) }
