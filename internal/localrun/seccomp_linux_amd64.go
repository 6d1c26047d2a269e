package localrun

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/seccomprules"
)

// The command's seccomp filter refuses what the container tier refuses
// (internal/seccomprules: keyrings, BPF, mounts, namespaces, MPTCP, ...),
// plus tracing other processes and raw or packet sockets, which a
// container's own namespaces make harmless but a process on the host must
// not have. Refusals go to agentbox as user notifications, so that each is
// explained on stderr before the call fails.
//
// File and connect calls also notify agentbox, which predicts from the
// plan whether Landlock or the empty network will refuse them and says so;
// those are always continued: the kernel, not agentbox, decides.

// tracingSyscalls reach into other processes' memory.
var tracingSyscalls = []string{"ptrace", "process_vm_readv", "process_vm_writev"}

// fileSyscalls are the path calls agentbox explains.
var fileSyscalls = []string{
	"open", "openat", "creat", "mkdir", "mkdirat", "unlink", "unlinkat", "rmdir",
	"rename", "renameat", "renameat2", "truncate", "link", "linkat", "symlink",
	"symlinkat", "mknod", "mknodat",
}

// reasonFor says why the filter refuses the syscall nr.
func reasonFor(name string) string {
	switch name {
	case "ptrace", "process_vm_readv", "process_vm_writev":
		return "tracing or reading another process's memory is not allowed: the command shares the kernel with your session"
	case "socket":
		return "MPTCP, raw and packet sockets are not allowed; use TCP or UDP"
	}
	return seccomprules.Reason(name)
}

// bpf assembles classic BPF with forward jumps to named labels.
type bpf struct {
	ins    []unix.SockFilter
	labels map[string]int
	jumps  map[int][2]string
}

func (p *bpf) op(code uint16, k uint32, jt, jf string) {
	if jt != "" || jf != "" {
		p.jumps[len(p.ins)] = [2]string{jt, jf}
	}
	p.ins = append(p.ins, unix.SockFilter{Code: code, K: k})
}

func (p *bpf) label(name string) { p.labels[name] = len(p.ins) }

func (p *bpf) assemble() ([]unix.SockFilter, error) {
	for i, j := range p.jumps {
		for k, name := range j {
			if name == "" {
				continue
			}
			to, ok := p.labels[name]
			d := to - i - 1
			if !ok || d < 0 || d > 255 {
				return nil, fmt.Errorf("seccomp filter: instruction %d cannot jump to %q", i, name)
			}
			if k == 0 {
				p.ins[i].Jt = uint8(d)
			} else {
				p.ins[i].Jf = uint8(d)
			}
		}
	}
	return p.ins, nil
}

const (
	ldAbs    = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
	jeq      = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
	jset     = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
	jge      = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
	ret      = unix.BPF_RET | unix.BPF_K
	aluAnd   = unix.BPF_ALU | unix.BPF_AND | unix.BPF_K
	x32Bit   = 0x40000000
	afPacket = unix.AF_PACKET
)

func argLow(i uint32) uint32  { return 16 + 8*i }
func argHigh(i uint32) uint32 { return 20 + 8*i }

// numbers maps syscall names to x86_64 numbers, skipping unknown ones.
func numbers(names []string) []uint32 {
	var out []uint32
	for _, n := range names {
		if nr, ok := ownSyscalls[n]; ok {
			out = append(out, nr)
		} else if nr, ok := seccomprules.SyscallNumber(n); ok {
			out = append(out, uint32(nr))
		}
	}
	return out
}

// syscallName names nr, for the calls the filter notifies.
func syscallName(nr int32) string {
	for n, v := range ownSyscalls {
		if int32(v) == nr {
			return n
		}
	}
	return seccomprules.SyscallName(int(nr))
}

// buildFilter returns the command's filter (x86_64 only: other
// architectures and the x32 ABI are killed, as in the container tier).
func buildFilter(explainFiles bool) ([]unix.SockFilter, error) {
	p := &bpf{labels: map[string]int{}, jumps: map[int][2]string{}}
	p.op(ldAbs, 4, "", "")
	p.op(jeq, auditArch, "", "kill")
	p.op(ldAbs, 0, "", "")
	p.op(jge, x32Bit, "kill", "")
	p.op(jeq, unix.SYS_CLONE3, "enosys", "")
	p.op(jeq, unix.SYS_CLONE, "clone", "")
	p.op(jeq, unix.SYS_SOCKET, "socket", "")
	p.op(jeq, unix.SYS_IOCTL, "ioctl", "")
	p.op(jeq, unix.SYS_CONNECT, "explain", "")
	denied := numbers(append(seccomprules.DeniedSyscalls(), tracingSyscalls...))
	if len(denied) > 150 {
		return nil, fmt.Errorf("seccomp filter: %d refused syscalls is too many for 8-bit jumps", len(denied))
	}
	for _, nr := range denied {
		p.op(jeq, nr, "notify", "")
	}
	if explainFiles {
		for _, nr := range numbers(fileSyscalls) {
			p.op(jeq, nr, "explain", "")
		}
	}
	p.op(ret, unix.SECCOMP_RET_ALLOW, "", "")

	var mask uint64
	for _, f := range seccomprules.NamespaceCloneFlags() {
		mask |= f
	}
	p.label("clone")
	p.op(ldAbs, argLow(0), "", "")
	p.op(jset, uint32(mask), "notify", "allow")

	p.label("socket")
	p.op(ldAbs, argLow(0), "", "")
	p.op(jeq, afPacket, "notify", "")
	p.op(ldAbs, argLow(1), "", "")
	p.op(aluAnd, 0xf, "", "") // the type, without SOCK_NONBLOCK/SOCK_CLOEXEC
	p.op(jeq, unix.SOCK_RAW, "notify", "")
	p.op(ldAbs, argHigh(2), "", "")
	p.op(jeq, 0, "", "allow")
	p.op(ldAbs, argLow(2), "", "")
	p.op(jeq, seccomprules.IPProtoMPTCP, "notify", "allow")

	p.label("ioctl")
	p.op(ldAbs, argHigh(1), "", "")
	p.op(jeq, 0, "", "allow")
	p.op(ldAbs, argLow(1), "", "")
	p.op(jeq, seccomprules.TIOCSTI, "notify", "allow")

	p.label("explain")
	p.op(ret, unix.SECCOMP_RET_USER_NOTIF, "", "")
	p.label("notify")
	p.op(ret, unix.SECCOMP_RET_USER_NOTIF, "", "")
	p.label("enosys")
	p.op(ret, unix.SECCOMP_RET_ERRNO|uint32(unix.ENOSYS), "", "")
	p.label("kill")
	p.op(ret, unix.SECCOMP_RET_KILL_PROCESS, "", "")
	p.label("allow")
	p.op(ret, unix.SECCOMP_RET_ALLOW, "", "")
	return p.assemble()
}

// installFilter installs the filter on every thread and returns the
// notification listener. no_new_privs must already be set (Landlock sets
// it).
func installFilter(explainFiles bool) (int, error) {
	prog, err := buildFilter(explainFiles)
	if err != nil {
		return -1, err
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return -1, fmt.Errorf("seccomp: no_new_privs: %w", err)
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	// TSYNC and NEW_LISTENER cannot be combined without TSYNC_ESRCH;
	// the helper is about to exec, so its other threads do not matter.
	fd, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER,
		unix.SECCOMP_FILTER_FLAG_NEW_LISTENER, uintptr(unsafe.Pointer(&fprog)))
	if errno != 0 {
		return -1, fmt.Errorf("seccomp: %w", errno)
	}
	return int(fd), nil
}
