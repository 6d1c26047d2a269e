package microvm

import (
	"errors"
	"strings"

	"github.com/agentbox/agentbox/internal/errdefs"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

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
// and checks the tier says which accelerator ran it (or, refused, why).
func TestProbeBootsGuest(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := findKernel(DefaultKernelDir); err != nil {
		t.Fatalf("guest kernel: %v (scripts/install-deps.sh installs it)", err)
	}
	d, err := New(Config{StateDir: t.TempDir(), RunDir: t.TempDir(), Envd: buildEnvd(t)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	accel, err := d.Accelerator()
	if err != nil {
		t.Fatalf("probe: %v", err)
	}
	if accel != "kvm" && accel != "tcg" {
		t.Fatalf("accelerator %q, want kvm or tcg", accel)
	}
	t.Logf("guest booted under %s", accel)
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
