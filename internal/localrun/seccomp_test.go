package localrun

import (
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/seccomprules"
)

// run interprets the filter's classic BPF over one seccomp_data, as the
// kernel does, and returns its action.
func run(t *testing.T, prog []unix.SockFilter, arch uint32, nr int32, args [6]uint64) uint32 {
	t.Helper()
	load := func(off uint32) uint32 {
		switch {
		case off == 0:
			return uint32(nr)
		case off == 4:
			return arch
		case off >= 16 && off < 64:
			a := args[(off-16)/8]
			if (off-16)%8 == 0 {
				return uint32(a)
			}
			return uint32(a >> 32)
		}
		t.Fatalf("load of offset %d", off)
		return 0
	}
	var acc uint32
	for pc := 0; pc < len(prog); pc++ {
		in := prog[pc]
		switch in.Code {
		case ldAbs:
			acc = load(in.K)
		case aluAnd:
			acc &= in.K
		case jeq, jset, jge:
			var ok bool
			switch in.Code {
			case jeq:
				ok = acc == in.K
			case jset:
				ok = acc&in.K != 0
			default:
				ok = acc >= in.K
			}
			if ok {
				pc += int(in.Jt)
			} else {
				pc += int(in.Jf)
			}
		case ret:
			return in.K
		default:
			t.Fatalf("unknown instruction %#x", in.Code)
		}
	}
	t.Fatal("the filter fell off its end")
	return 0
}

func TestFilter(t *testing.T) {
	const x86 = unix.AUDIT_ARCH_X86_64
	notify, allow, kill := uint32(unix.SECCOMP_RET_USER_NOTIF), uint32(unix.SECCOMP_RET_ALLOW), uint32(unix.SECCOMP_RET_KILL_PROCESS)
	for _, explain := range []bool{true, false} {
		prog, err := buildFilter(explain)
		if err != nil {
			t.Fatal(err)
		}
		openat := allow
		if explain {
			openat = notify
		}
		for _, tc := range []struct {
			name string
			arch uint32
			nr   int32
			args [6]uint64
			want uint32
		}{
			{"read", x86, unix.SYS_READ, [6]uint64{}, allow},
			{"ptrace", x86, unix.SYS_PTRACE, [6]uint64{16}, notify},
			{"process_vm_readv", x86, unix.SYS_PROCESS_VM_READV, [6]uint64{}, notify},
			{"keyctl", x86, unix.SYS_KEYCTL, [6]uint64{}, notify},
			{"bpf", x86, unix.SYS_BPF, [6]uint64{}, notify},
			{"userfaultfd", x86, unix.SYS_USERFAULTFD, [6]uint64{}, notify},
			{"mount", x86, unix.SYS_MOUNT, [6]uint64{}, notify},
			{"unshare", x86, unix.SYS_UNSHARE, [6]uint64{unix.CLONE_NEWUSER}, notify},
			{"clone a thread", x86, unix.SYS_CLONE, [6]uint64{unix.CLONE_VM | unix.CLONE_THREAD}, allow},
			{"clone a user namespace", x86, unix.SYS_CLONE, [6]uint64{unix.CLONE_NEWUSER}, notify},
			{"clone3", x86, unix.SYS_CLONE3, [6]uint64{}, unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)},
			{"TCP socket", x86, unix.SYS_SOCKET, [6]uint64{unix.AF_INET, unix.SOCK_STREAM | unix.SOCK_CLOEXEC, 0}, allow},
			{"MPTCP socket", x86, unix.SYS_SOCKET, [6]uint64{unix.AF_INET, unix.SOCK_STREAM, seccomprules.IPProtoMPTCP}, notify},
			{"raw socket", x86, unix.SYS_SOCKET, [6]uint64{unix.AF_INET, unix.SOCK_RAW | unix.SOCK_NONBLOCK, 1}, notify},
			{"packet socket", x86, unix.SYS_SOCKET, [6]uint64{unix.AF_PACKET, unix.SOCK_DGRAM, 0}, notify},
			{"TIOCSTI", x86, unix.SYS_IOCTL, [6]uint64{0, unix.TIOCSTI}, notify},
			{"TCGETS", x86, unix.SYS_IOCTL, [6]uint64{0, unix.TCGETS}, allow},
			{"connect", x86, unix.SYS_CONNECT, [6]uint64{}, notify},
			{"openat", x86, unix.SYS_OPENAT, [6]uint64{}, openat},
			{"renameat2", x86, unix.SYS_RENAMEAT2, [6]uint64{}, openat},
			{"i386", unix.AUDIT_ARCH_I386, 1, [6]uint64{}, kill},
			{"x32", x86, 0x40000000 | unix.SYS_READ, [6]uint64{}, kill},
		} {
			if got := run(t, prog, tc.arch, tc.nr, tc.args); got != tc.want {
				t.Errorf("explain=%v %s: action %#x, want %#x", explain, tc.name, got, tc.want)
			}
		}
	}
}
