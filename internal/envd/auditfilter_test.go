package envd

import (
	"errors"
	"os"
	"os/exec"
	"testing"

	"golang.org/x/sys/unix"
)

// TestLogRefusals installs the filter in a child process (it cannot be
// taken off again) and checks that it refuses exactly the listed call.
func TestLogRefusals(t *testing.T) {
	if os.Getenv("ENVD_AUDITFILTER_CHILD") == "1" {
		// no_new_privs stands in for CAP_SYS_ADMIN, which a test lacks.
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			t.Fatal(err)
		}
		if err := LogRefusals([]uint32{unix.SYS_BPF, unix.SYS_KEYCTL}); err != nil {
			t.Fatal(err)
		}
		if _, _, errno := unix.Syscall(unix.SYS_BPF, 0, 0, 0); !errors.Is(errno, unix.EPERM) {
			t.Fatalf("bpf: %v, want EPERM", errno)
		}
		if _, _, errno := unix.Syscall(unix.SYS_KEYCTL, 0, 0, 0); !errors.Is(errno, unix.EPERM) {
			t.Fatalf("keyctl: %v, want EPERM", errno)
		}
		if unix.Getpid() != os.Getpid() || unix.Getuid() != os.Getuid() {
			t.Fatal("other syscalls broken")
		}
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestLogRefusals$", "-test.v")
	cmd.Env = append(os.Environ(), "ENVD_AUDITFILTER_CHILD=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
}

func TestRefusalFilterBounds(t *testing.T) {
	if err := LogRefusals(nil); err == nil {
		t.Error("empty list accepted")
	}
	if err := LogRefusals(make([]uint32, 201)); err == nil {
		t.Error("201 syscalls accepted (jump offsets are 8 bits)")
	}
	prog := refusalFilter([]uint32{1, 2, 3})
	// Every jump of the list lands on the EPERM return, the last instruction.
	for i := 3; i < 6; i++ {
		if got := i + 1 + int(prog[i].Jt); got != len(prog)-1 {
			t.Errorf("instruction %d jumps to %d, want %d", i, got, len(prog)-1)
		}
	}
	if got := 1 + 1 + int(prog[1].Jf); got != len(prog)-2 {
		t.Errorf("foreign arch jumps to %d, want the ALLOW at %d", got, len(prog)-2)
	}
}
