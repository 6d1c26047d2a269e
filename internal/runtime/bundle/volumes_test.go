package bundle

import (
	"os"
	"path/filepath"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/testutil"
)

// TestRemoveBundleKeepsVolumes (root): removing a bundle detaches its
// volume mounts (also stacked ones) and never removes through them; the
// volume binds come last in config.json.
func TestRemoveBundleKeepsVolumes(t *testing.T) {
	testutil.RequireRoot(t)
	base := t.TempDir()
	vol := filepath.Join(base, "vol")
	if err := os.Mkdir(vol, 0o755); err != nil {
		t.Fatal(err)
	}
	// The volume must be a mount of its own, as the server's is.
	if err := unix.Mount(vol, vol, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(vol, unix.MNT_DETACH) })
	if err := os.WriteFile(filepath.Join(vol, "keep"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(base, "bundle")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	s := &Store{}
	var rb Rollback
	vols := []runtime.VolumeMount{{Source: vol, Path: "/workspace"}, {Source: vol, Path: "/tmp/w"}}
	if err := s.mountVolumes(t.Context(), dir, vols, false, 0, &rb); err != nil {
		t.Fatal(err)
	}
	for i := range vols {
		if !IsMountPoint(volumeTarget(dir, i)) {
			t.Fatalf("volume %d not mounted", i)
		}
	}
	if b, err := os.ReadFile(filepath.Join(volumeTarget(dir, 1), "keep")); err != nil || string(b) != "data" {
		t.Fatalf("through the bundle's mount: %q %v", b, err)
	}
	oci := &specs.Spec{Mounts: []specs.Mount{{Destination: "/proc"}, {Destination: "/tmp", Type: "tmpfs"}}}
	addVolumeMounts(oci, dir, vols)
	if n := len(oci.Mounts); oci.Mounts[n-2].Destination != "/workspace" || oci.Mounts[n-1].Destination != "/tmp/w" || oci.Mounts[n-1].Source != volumeTarget(dir, 1) {
		t.Fatalf("mounts %+v", oci.Mounts)
	}
	if err := removeBundleDir(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("bundle left: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(vol, "keep")); err != nil || string(b) != "data" {
		t.Fatalf("the volume's file after the bundle's removal: %q %v", b, err)
	}

	// Mounts stacked on a volume's mount point are all detached first.
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	rb = Rollback{}
	if err := s.mountVolumes(t.Context(), dir, vols[:1], false, 0, &rb); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(vol, volumeTarget(dir, 0), "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	if err := removeBundleDir(dir); err != nil {
		t.Fatalf("stacked mounts: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(vol, "keep")); err != nil || string(b) != "data" {
		t.Fatalf("the volume's file after removing a bundle with stacked mounts: %q %v", b, err)
	}
	rb.Run()
}
