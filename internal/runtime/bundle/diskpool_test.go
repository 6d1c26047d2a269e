package bundle

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/testutil"
)

// poolStore is a Store with only what mountDisk needs and a disk pool of want.
func poolStore(t *testing.T, want int) (*Store, string) {
	t.Helper()
	base := t.TempDir()
	s := &Store{cfg: Config{DiskImageDir: filepath.Join(base, "disk-images")}, log: slog.Default()}
	p, err := newDiskPool(filepath.Join(base, DiskPoolDirName), want, s.log, s.makeDetachedDisk)
	if err != nil {
		t.Fatal(err)
	}
	s.disks = p
	t.Cleanup(s.Close)
	return s, base
}

// waitReady waits until the pool has n disks ready.
func waitReady(t *testing.T, s *Store, n int) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		if ready, _ := s.DiskPoolStats(); ready >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool never had %d disks ready", n)
		}
	}
}

// loopsBackedBy counts the loop devices whose backing file is under dir.
func loopsBackedBy(t *testing.T, dir string) int {
	t.Helper()
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	n := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err == nil && strings.HasPrefix(strings.TrimSpace(string(b)), dir) {
			n++
		}
	}
	return n
}

// TestDiskPool (root): creates take disks made ahead, each a fresh
// filesystem of the size asked (what one sandbox wrote is not on the
// next one's disk, the size still bounds writes), the pool refills, and
// closing it leaves no file, mount or loop device.
func TestDiskPool(t *testing.T) {
	testutil.RequireRoot(t)
	const mb = 64
	s, base := poolStore(t, 2)
	bundle := func(name string) string {
		dir := filepath.Join(base, name)
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := s.mountDisk(t.Context(), dir, mb); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = unmountDisk(dir) })
		return dir
	}

	first := bundle("a") // nothing ready yet: made in the create, starts the pool
	if _, taken := s.DiskPoolStats(); taken != 0 {
		t.Fatalf("first create took %d pooled disks from an empty pool", taken)
	}
	waitReady(t, s, 2)
	second := bundle("b")
	if _, taken := s.DiskPoolStats(); taken != 1 {
		t.Fatalf("taken = %d after a create with disks ready, want 1", taken)
	}
	for _, dir := range []string{first, second} {
		_, total, ok := diskUsageStatfs(dir)
		if !ok {
			t.Fatalf("%s: no filesystem of its own", dir)
		}
		if total > mb<<20 || total < (mb-mb/5)<<20 {
			t.Errorf("%s: disk of %d bytes, want about %d MiB", dir, total, mb)
		}
		for _, sub := range []string{"upper", "work"} {
			if fi, err := os.Stat(filepath.Join(dir, diskDirName, sub)); err != nil || !fi.IsDir() {
				t.Errorf("%s: %s on the disk: %v", dir, sub, err)
			}
		}
		var st unix.Statfs_t
		if err := unix.Statfs(filepath.Join(dir, diskDirName), &st); err != nil || st.Flags&unix.ST_NOSUID == 0 || st.Flags&unix.ST_NODEV == 0 {
			t.Errorf("%s: disk mount flags %#x (%v), want nosuid and nodev", dir, st.Flags, err)
		}
	}

	// One sandbox's writes are its own, and its size bounds them.
	secret := filepath.Join(second, diskDirName, "upper", "secret")
	if err := os.WriteFile(secret, []byte("b's"), 0o600); err != nil {
		t.Fatal(err)
	}
	waitReady(t, s, 2)
	third := bundle("c")
	if _, taken := s.DiskPoolStats(); taken != 2 {
		t.Fatalf("taken = %d, want 2", taken)
	}
	entries, err := os.ReadDir(filepath.Join(third, diskDirName, "upper"))
	if err != nil || len(entries) != 0 {
		t.Fatalf("the next sandbox's upper dir holds %v (%v), want nothing", entries, err)
	}
	f, err := os.Create(filepath.Join(third, diskDirName, "upper", "fill"))
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 1<<20)
	var werr error
	for range 2 * mb {
		if _, werr = f.Write(chunk); werr != nil {
			break
		}
	}
	f.Close()
	if !errors.Is(werr, unix.ENOSPC) {
		t.Fatalf("writing twice the disk's size: %v, want ENOSPC", werr)
	}

	// Closing drops the ready disks: no file, no loop device left.
	pool := filepath.Join(base, DiskPoolDirName)
	waitReady(t, s, 2)
	s.Close()
	if left, _ := os.ReadDir(pool); len(left) != 0 {
		t.Errorf("pool dir holds %d entries after close", len(left))
	}
	for deadline := time.Now().Add(10 * time.Second); loopsBackedBy(t, pool) > 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d loop devices still backed by the pool's files after close", loopsBackedBy(t, pool))
		}
	}
	if d, ok := s.disks.take(mb); ok {
		d.drop()
		t.Error("a closed pool handed out a disk")
	}
}

// TestDiskPoolSizeChange (root): a create asking another size gets a
// disk of that size, and the pool follows it.
func TestDiskPoolSizeChange(t *testing.T) {
	testutil.RequireRoot(t)
	s, base := poolStore(t, 1)
	for i, mb := range []int{32, 32, 48, 48} {
		dir := filepath.Join(base, "b"+string(rune('0'+i)))
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := s.mountDisk(t.Context(), dir, mb); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = unmountDisk(dir) })
		_, total, ok := diskUsageStatfs(dir)
		if !ok || total > uint64(mb)<<20 || total < uint64(mb-mb/4)<<20 {
			t.Errorf("create %d: disk of %d bytes (%v), want about %d MiB", i, total, ok, mb)
		}
		waitReady(t, s, 1)
	}
	if _, taken := s.DiskPoolStats(); taken != 2 {
		t.Errorf("taken = %d, want 2 (the second create of each size)", taken)
	}
}

// TestNewDiskPoolRemovesLeftovers: a start removes the image files a
// killed server's pool left (the kernel dropped their mounts with it).
func TestNewDiskPoolRemovesLeftovers(t *testing.T) {
	dir := filepath.Join(t.TempDir(), DiskPoolDirName)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "left.img"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, want := range []int{0, 2} {
		if _, err := newDiskPool(dir, want, slog.Default(), nil); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(dir, "left.img")); !os.IsNotExist(err) {
			t.Errorf("want %d: leftover image still there: %v", want, err)
		}
	}
}
