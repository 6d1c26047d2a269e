package bundle

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Attaching a sandbox's disk image to a loop device and mounting its ext4
// are the slow part of a create's disk, and their cost depends on the
// machine (10-40 ms here, far more on a busy host: LOOP_CONFIGURE freezes
// the device's queue, the mount reads the filesystem's metadata through
// it). The disk pool does that work ahead: it keeps a few disks, each a
// fresh sparse copy of the formatted empty image, attached and mounted as
// a detached mount (fsmount: in no mount table, reachable only through
// the server's descriptor), and a create attaches one in its bundle with
// move_mount, then the pool makes another in the background.
//
// A pooled disk is used once: it is made for no one in particular, taken
// by exactly one sandbox, and removed with that sandbox's bundle; it never
// returns to the pool. The pool holds open descriptors and image files
// only: if the server dies, the kernel drops the detached mounts with its
// descriptors (the loop devices clear themselves), and the next start
// removes the files.

// DiskPoolDirName (exported for the host-state checks that tell its ready
// disks from leaks) holds the pooled disks' image files, beside the
// sandboxes' state dir.
const DiskPoolDirName = "disk-pool"

// diskPool keeps ready disks of one size.
type diskPool struct {
	dir   string
	want  int // ready disks to keep; 0: no pool
	log   *slog.Logger
	build func(ctx context.Context, mb int, file string) (*os.File, error)

	mu      sync.Mutex
	mb      int // size kept: the last size a create asked for
	ready   []pooledDisk
	filling bool
	closed  bool
	// taken counts the creates that got a pooled disk.
	taken atomic.Int64
}

// pooledDisk is a ready disk: its image file and its detached mount.
type pooledDisk struct {
	mb   int
	file string
	mnt  *os.File
}

// drop releases a disk no sandbox got: closing the last reference to the
// detached mount unmounts it, which detaches the loop device.
func (d pooledDisk) drop() {
	_ = d.mnt.Close()
	_ = os.Remove(d.file)
}

// newDiskPool removes what an earlier process's pool left and returns a
// pool keeping want disks.
func newDiskPool(dir string, want int, log *slog.Logger, mk func(ctx context.Context, mb int, file string) (*os.File, error)) (*diskPool, error) {
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("disk pool: remove what an earlier run left: %w", err)
	}
	p := &diskPool{dir: dir, want: want, log: log, build: mk}
	if want > 0 {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("disk pool: %w", err)
		}
	}
	return p, nil
}

// take returns a ready disk of mb MiB, if there is one, and starts
// refilling. The pool keeps the size creates last asked for.
func (p *diskPool) take(mb int) (pooledDisk, bool) {
	if p == nil || p.want <= 0 {
		return pooledDisk{}, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return pooledDisk{}, false
	}
	if mb != p.mb {
		for _, d := range p.ready {
			d.drop()
		}
		p.ready, p.mb = nil, mb
	}
	var d pooledDisk
	ok := len(p.ready) > 0
	if ok {
		d = p.ready[len(p.ready)-1]
		p.ready = p.ready[:len(p.ready)-1]
		p.taken.Add(1)
	}
	if !p.filling {
		p.filling = true
		go p.fill()
	}
	return d, ok
}

// fill makes disks until the pool has want of the size kept. A failure
// stops it until the next take; creates meanwhile make their own disks.
func (p *diskPool) fill() {
	for {
		p.mu.Lock()
		mb := p.mb
		if p.closed || len(p.ready) >= p.want {
			p.filling = false
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
		d, err := p.makeOne(mb)
		p.mu.Lock()
		if err != nil {
			p.filling = false
			p.mu.Unlock()
			p.log.Warn("disk pool: making a disk ahead failed; creates make their own", "mb", mb, "err", err)
			return
		}
		if p.closed || mb != p.mb {
			p.mu.Unlock()
			d.drop()
			continue
		}
		p.ready = append(p.ready, d)
		p.mu.Unlock()
	}
}

func (p *diskPool) makeOne(mb int) (pooledDisk, error) {
	var b [12]byte
	_, _ = rand.Read(b[:])
	file := filepath.Join(p.dir, hex.EncodeToString(b[:])+".img")
	mnt, err := p.build(context.Background(), mb, file)
	if err != nil {
		_ = os.Remove(file)
		return pooledDisk{}, err
	}
	return pooledDisk{mb: mb, file: file, mnt: mnt}, nil
}

// close drops every ready disk and stops refilling.
func (p *diskPool) close() {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, d := range p.ready {
		d.drop()
	}
	p.ready = nil
}

// size is how many disks are ready.
func (p *diskPool) size() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.ready)
}

// makeDetachedDisk makes a fresh sparse copy of the empty mb MiB image at
// file, attaches it to a loop device and mounts its ext4 detached: the
// returned descriptor is the only reference to the mount.
func (s *Store) makeDetachedDisk(ctx context.Context, mb int, file string) (*os.File, error) {
	img, err := s.diskImage(ctx, mb)
	if err != nil {
		return nil, err
	}
	if err := sparseCopy(img, file); err != nil {
		return nil, fmt.Errorf("copy disk image: %w", err)
	}
	dev, f, err := attachLoop(file)
	if err != nil {
		return nil, err
	}
	defer f.Close() // the mount holds the device; autoclear frees it with the mount
	fsfd, err := unix.Fsopen("ext4", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("fsopen ext4: %w", err)
	}
	defer unix.Close(fsfd)
	if err := unix.FsconfigSetString(fsfd, "source", dev); err != nil {
		return nil, fmt.Errorf("fsconfig source %s: %w", dev, err)
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return nil, fmt.Errorf("mount %s: %w", dev, err)
	}
	mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return nil, fmt.Errorf("fsmount %s: %w", dev, err)
	}
	return os.NewFile(uintptr(mfd), "disk:"+filepath.Base(file)), nil
}

// attachPooledDisk puts pooled disk d in bundle dir as <dir>/disk (and its
// image as <dir>/disk.img). On error d is dropped and dir is as before.
func attachPooledDisk(d pooledDisk, dir string) (err error) {
	defer func() {
		if err != nil {
			d.drop()
		}
	}()
	file := filepath.Join(dir, "disk.img")
	if err := os.Rename(d.file, file); err != nil {
		return err
	}
	d.file = file
	mnt := filepath.Join(dir, diskDirName)
	if err := os.Mkdir(mnt, 0o755); err != nil {
		return err
	}
	if err := unix.MoveMount(int(d.mnt.Fd()), "", unix.AT_FDCWD, mnt, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		_ = os.Remove(mnt)
		return fmt.Errorf("move_mount: %w", err)
	}
	// Attached: the mount table holds it now.
	_ = d.mnt.Close()
	return nil
}
