package microvm

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/testutil"
)

// buildEnvd builds the static envd the guest runs as its init.
func buildEnvd(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "envd")
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, "github.com/agentbox/agentbox/cmd/envd")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build envd: %v\n%s", err, b)
	}
	return out
}

// TestProbeBootsGuest boots the installed guest kernel with envd as init
// under TCG (pinned: the automatic choice is remembered per host boot).
func TestProbeBootsGuest(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := findKernel(DefaultKernelDir); err != nil {
		t.Fatalf("guest kernel: %v (scripts/install-deps.sh installs it)", err)
	}
	d, err := New(Config{StateDir: t.TempDir(), RunDir: t.TempDir(), Envd: buildEnvd(t), Accel: "tcg"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	accel, err := d.Accelerator()
	if err != nil {
		t.Fatalf("probe: %v", err)
	}
	if accel != "tcg" {
		t.Fatalf("accelerator %q, want tcg", accel)
	}
}

// TestRefusedWithReason: without QEMU the tier is unavailable and says how
// to install it.
func TestRefusedWithReason(t *testing.T) {
	for _, tc := range []struct{ name, qemu, kernels string }{
		{"no qemu", "/nonexistent/qemu-system-x86_64", DefaultKernelDir},
		{"no kernel", "", t.TempDir()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := New(Config{StateDir: t.TempDir(), RunDir: t.TempDir(), Envd: "/nonexistent/envd", QEMU: tc.qemu, KernelDir: tc.kernels}, nil)
			if err != nil {
				t.Fatal(err)
			}
			err = d.Tier().Available()
			if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "install-deps.sh") {
				t.Fatalf("Available() = %v, want ErrUnavailable with an install hint", err)
			}
		})
	}
}

// TestFindKernel: the kernel layout install-deps writes is read in order;
// a module list naming files elsewhere or missing files is refused.
func TestFindKernel(t *testing.T) {
	for _, tc := range []struct {
		name, order string
		files       []string
		want        []string // module base names; nil: an error
	}{
		{"ordered", "virtio_ring.ko\nvirtio.ko\n", []string{"virtio_ring.ko", "virtio.ko"}, []string{"virtio_ring.ko", "virtio.ko"}},
		{"path escape", "../../etc/x.ko\n", nil, nil},
		{"not a module", "order\n", nil, nil},
		{"missing file", "virtio.ko\n", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			kdir := filepath.Join(dir, "6.1.0-test")
			if err := os.MkdirAll(filepath.Join(kdir, "modules"), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(kdir, "vmlinux"), []byte("ELF"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(kdir, "modules", "order"), []byte(tc.order), 0o600); err != nil {
				t.Fatal(err)
			}
			for _, f := range tc.files {
				if err := os.WriteFile(filepath.Join(kdir, "modules", f), nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			k, err := findKernel(dir)
			if tc.want == nil {
				if err == nil {
					t.Fatalf("findKernel accepted %q", tc.order)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, m := range k.Modules {
				got = append(got, filepath.Base(m))
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") || k.Version != "6.1.0-test" {
				t.Fatalf("got %s %v, want %v", k.Version, got, tc.want)
			}
		})
	}
}
