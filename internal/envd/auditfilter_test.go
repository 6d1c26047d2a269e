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
		if _, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 262); !errors.Is(err, unix.EPROTONOSUPPORT) {
			t.Fatalf("MPTCP socket: %v, want EPROTONOSUPPORT", err)
		}
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
		if err != nil {
			t.Fatalf("TCP socket: %v", err)
		}
		unix.Close(fd)
		if _, _, errno := unix.Syscall(unix.SYS_CLONE, unix.CLONE_NEWUSER|uintptr(unix.SIGCHLD), 0, 0); !errors.Is(errno, unix.EPERM) {
			t.Fatalf("clone(CLONE_NEWUSER): %v, want EPERM", errno)
		}
		if err := unix.IoctlSetPointerInt(0, unix.TIOCSTI, 0); !errors.Is(err, unix.EPERM) {
			t.Fatalf("TIOCSTI: %v, want EPERM", err)
		}
		if out, err := exec.Command("/bin/true").CombinedOutput(); err != nil { // fork and exec still work
			t.Fatalf("fork/exec: %v %s", err, out)
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
	prog, err := refusalFilter([]uint32{1, 2, 3})
	if err != nil {
		t.Fatal(err)
	}
	// Every jump lands inside the program, forwards.
	for i, in := range prog {
		if in.Code&0x07 != unix.BPF_JMP { // the instruction class
			continue
		}
		if t1, f1 := i+1+int(in.Jt), i+1+int(in.Jf); t1 >= len(prog) || f1 >= len(prog) {
			t.Errorf("instruction %d jumps out (%d, %d of %d)", i, t1, f1, len(prog))
		}
	}
	if last := prog[len(prog)-1]; last.Code != bpfReturn {
		t.Errorf("the program does not end in a return: %+v", last)
	}
}
