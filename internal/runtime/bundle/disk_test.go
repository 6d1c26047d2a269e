package bundle

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/testutil"
)

// TestMountDisk (root): a sandbox's disk is an ext4 filesystem of the size
// asked for with the overlay's dirs on it, made from a copy of the cached
// empty image that holds little data (each create copies it) and already
// has the overlay's dirs, and images of earlier formats are dropped once
// the current one is made.
func TestMountDisk(t *testing.T) {
	testutil.RequireRoot(t)
	base := t.TempDir()
	images := filepath.Join(base, "disk-images")
	if err := os.MkdirAll(images, 0o700); err != nil {
		t.Fatal(err)
	}
	const mb = 10240
	for _, v := range diskImageOldVersions {
		if err := os.WriteFile(filepath.Join(images, diskImageName(mb, v)), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s := &Store{cfg: Config{DiskImageDir: images}}
	dir := filepath.Join(base, "bundle")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := s.mountDisk(t.Context(), dir, mb); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unmountDisk(dir) })
	for _, v := range diskImageOldVersions {
		if _, err := os.Stat(filepath.Join(images, diskImageName(mb, v))); !os.IsNotExist(err) {
			t.Errorf("image of the earlier format %q still there: %v", v, err)
		}
	}
	used, total, ok := diskUsageStatfs(dir)
	if !ok {
		t.Fatal("no filesystem of its own at <bundle>/disk")
	}
	if total < (mb-mb/20)<<20 || total > mb<<20 {
		t.Errorf("disk of %d bytes, want about %d MiB", total, mb)
	}
	if used > 64<<20 {
		t.Errorf("empty disk uses %d bytes", used)
	}
	for _, sub := range []string{"upper", "work"} {
		if fi, err := os.Stat(filepath.Join(dir, diskDirName, sub)); err != nil || !fi.IsDir() {
			t.Errorf("%s on the disk: %v", sub, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, diskDirName, "lost+found")); !os.IsNotExist(err) {
		t.Errorf("lost+found would show in the sandbox's /: %v", err)
	}
	// The copy's data: what every create writes.
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dir, "disk.img"), &st); err != nil {
		t.Fatal(err)
	}
	if data := st.Blocks * 512; data > 1<<20 {
		t.Errorf("the sandbox's copy of the empty image holds %d bytes of data, want under 1 MiB", data)
	}
}

// TestMountDiskImageWithoutLayerDirs (root): an image without the
// overlay's dirs (made by hand, or by a format that lacked them) still
// gives a disk with them and without lost+found.
func TestMountDiskImageWithoutLayerDirs(t *testing.T) {
	testutil.RequireRoot(t)
	base := t.TempDir()
	images := filepath.Join(base, "disk-images")
	if err := os.MkdirAll(images, 0o700); err != nil {
		t.Fatal(err)
	}
	const mb = 64
	img := filepath.Join(images, diskImageName(mb, diskImageVersion))
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, mb<<20); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	s := &Store{cfg: Config{DiskImageDir: images}}
	dir := filepath.Join(base, "bundle")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := s.mountDisk(t.Context(), dir, mb); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unmountDisk(dir) })
	for _, sub := range []string{"upper", "work"} {
		if fi, err := os.Stat(filepath.Join(dir, diskDirName, sub)); err != nil || !fi.IsDir() {
			t.Errorf("%s on the disk: %v", sub, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, diskDirName, "lost+found")); !os.IsNotExist(err) {
		t.Errorf("lost+found would show in the sandbox's /: %v", err)
	}
}
