package runc

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/runtime"
)

func TestSealBinary(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	sb, err := sealBinary(sh)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.f.Close()
	if int(sb.f.Fd()) < sealedFdMin {
		t.Errorf("sealed copy at fd %d, want at least %d", sb.f.Fd(), sealedFdMin)
	}
	seals, err := unix.FcntlInt(sb.f.Fd(), unix.F_GET_SEALS, 0)
	if err != nil || seals != runcMemfdSeals {
		t.Fatalf("seals %#x, %v; want exactly runc's %#x", seals, err, runcMemfdSeals)
	}
	// The child executes the copy itself (runc's check reads its own
	// /proc/self/exe), by the path the driver hands go-runc.
	out, err := exec.Command(sb.path, "-c", "readlink /proc/$$/exe").CombinedOutput()
	if err != nil {
		t.Fatalf("run sealed copy: %v: %s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != sealedMemfdName {
		t.Errorf("child's exe = %q, want %q", got, sealedMemfdName)
	}
	// Nobody can change it: not through a new descriptor, not by growing it.
	if f, err := os.OpenFile(sb.path, os.O_WRONLY, 0); err == nil {
		_, werr := f.Write([]byte("#!"))
		f.Close()
		if werr == nil {
			t.Error("wrote to the sealed copy")
		}
	}
	if err := unix.Ftruncate(int(sb.f.Fd()), 1); err == nil {
		t.Error("truncated the sealed copy")
	}
}

func TestSealBinaryRefusesMissing(t *testing.T) {
	if _, err := sealBinary("/nonexistent/runc"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("err = %v, want not exist", err)
	}
}

// TestCreateRunsSealedRunc: runc init runs from the driver's sealed copy
// (no copy of its own per create), and a driver without it still creates.
func TestCreateRunsSealedRunc(t *testing.T) {
	e := setup(t)
	if e.rc.sealed == nil {
		t.Fatal("the driver has no sealed copy of runc")
	}
	ep := e.sandbox(t, "rtsealed1", runtime.Resources{CPUCount: 1, MemoryMB: 256, PIDs: 128})
	if got := get(t, ep, "hostname"); got != "rtsealed1" {
		t.Fatalf("hostname = %q", got)
	}
	if n := e.rc.sealedInits.Load(); n != 1 {
		t.Fatalf("%d inits ran from the sealed copy, want 1", n)
	}

	// Fallback: runc from its file copies itself, and creates still work.
	e.rc.sealed, e.rc.Base.Binary = nil, e.rc.cfg.Binary
	ep = e.sandbox(t, "rtsealed2", runtime.Resources{CPUCount: 1, MemoryMB: 256, PIDs: 128})
	if got := get(t, ep, "hostname"); got != "rtsealed2" {
		t.Fatalf("hostname = %q", got)
	}
	if n := e.rc.sealedInits.Load(); n != 1 {
		t.Fatalf("sealed inits = %d after a create without the copy, want still 1", n)
	}
	if st, err := e.rt.State(context.Background(), "rtsealed1"); err != nil || st != runtime.StatusRunning {
		t.Fatalf("first sandbox: %q, %v", st, err)
	}
}
