package envd

import (
	"fmt"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/seccomprules"
)

// Refused syscalls leave no trace: the runtime's seccomp filter answers
// EPERM and the kernel logs nothing, because runc 1.1 cannot set
// SECCOMP_FILTER_FLAG_LOG on it. So envd, as the sandbox's init, stacks a
// second filter that refuses the same calls with the same error, with that
// flag: the kernel then reports each refusal to the host's audit log, where
// the server turns it into a "syscall" audit event of the sandbox. For the
// newest filter to be the one that decides (and so the one that logs), it
// must go on before anything else runs. Installing it without no_new_privs
// (which would break sudo) needs CAP_SYS_ADMIN in the sandbox's user
// namespace, which the runtime grants to envd alone; DropSysAdmin takes it
// away again before envd serves anything.

// LogRefusals installs, on every thread, a seccomp filter that refuses the
// x86_64 syscalls nrs with EPERM, and the argument-dependent calls of
// internal/seccomprules as the policy does, and asks the kernel to log each
// refusal.
func LogRefusals(nrs []uint32) error {
	if len(nrs) == 0 || len(nrs) > 200 {
		return fmt.Errorf("audit filter: %d syscalls, want 1 to 200", len(nrs)) // 8-bit jumps
	}
	prog, err := refusalFilter(nrs)
	if err != nil {
		return err
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	r1, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER,
		unix.SECCOMP_FILTER_FLAG_TSYNC|unix.SECCOMP_FILTER_FLAG_LOG, uintptr(unsafe.Pointer(&fprog)))
	if errno != 0 {
		return fmt.Errorf("audit filter: seccomp: %w", errno)
	}
	if r1 != 0 {
		return fmt.Errorf("audit filter: thread %d could not take the filter", r1)
	}
	return nil
}

// Classic BPF over struct seccomp_data: nr at offset 0, arch at 4, then
// the six 64-bit arguments from 16 (low word first on x86_64).
const (
	bpfLoadAbs = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
	bpfJumpEq  = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
	bpfJumpSet = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
	bpfReturn  = unix.BPF_RET | unix.BPF_K
)

func argLow(i uint32) uint32  { return 16 + 8*i }
func argHigh(i uint32) uint32 { return 20 + 8*i }

// bpfProg assembles a filter with forward jumps to named labels.
type bpfProg struct {
	ins    []unix.SockFilter
	labels map[string]int
	jt, jf map[int]string // instruction → label of its true/false branch
}

func (p *bpfProg) op(code uint16, k uint32, jt, jf string) {
	if jt != "" {
		p.jt[len(p.ins)] = jt
	}
	if jf != "" {
		p.jf[len(p.ins)] = jf
	}
	p.ins = append(p.ins, unix.SockFilter{Code: code, K: k})
}

func (p *bpfProg) label(name string) { p.labels[name] = len(p.ins) }

// assemble resolves the jumps; BPF jumps go forwards, at most 255 steps.
func (p *bpfProg) assemble() ([]unix.SockFilter, error) {
	offset := func(i int, name string) (uint8, error) {
		to, ok := p.labels[name]
		if d := to - i - 1; ok && d >= 0 && d <= 255 {
			return uint8(d), nil
		}
		return 0, fmt.Errorf("audit filter: instruction %d cannot jump to %q", i, name)
	}
	var err error
	for i, name := range p.jt {
		if p.ins[i].Jt, err = offset(i, name); err != nil {
			return nil, err
		}
	}
	for i, name := range p.jf {
		if p.ins[i].Jf, err = offset(i, name); err != nil {
			return nil, err
		}
	}
	return p.ins, nil
}

// refusalFilter mirrors the container tier's policy on x86_64: the listed
// calls and the argument rules of internal/seccomprules get the same
// errors; other architectures and calls pass (the runtime's filter rules
// on them). clone3 (answered ENOSYS so that libc falls back to clone) is
// left out: libc tries it before every fork.
func refusalFilter(nrs []uint32) ([]unix.SockFilter, error) {
	p := &bpfProg{labels: map[string]int{}, jt: map[int]string{}, jf: map[int]string{}}
	p.op(bpfLoadAbs, 4, "", "")
	p.op(bpfJumpEq, unix.AUDIT_ARCH_X86_64, "", "allow")
	p.op(bpfLoadAbs, 0, "", "")
	p.op(bpfJumpEq, unix.SYS_CLONE, "clone", "")
	p.op(bpfJumpEq, unix.SYS_SOCKET, "socket", "")
	p.op(bpfJumpEq, unix.SYS_IOCTL, "ioctl", "")
	for _, nr := range nrs {
		p.op(bpfJumpEq, nr, "eperm", "")
	}
	p.op(bpfReturn, unix.SECCOMP_RET_ALLOW, "", "")

	var mask uint64
	for _, f := range seccomprules.NamespaceCloneFlags() {
		mask |= f
	}
	p.label("clone")
	p.op(bpfLoadAbs, argLow(0), "", "")
	p.op(bpfJumpSet, uint32(mask), "eperm", "allow")

	p.label("socket")
	p.op(bpfLoadAbs, argHigh(2), "", "")
	p.op(bpfJumpEq, 0, "", "allow")
	p.op(bpfLoadAbs, argLow(2), "", "")
	p.op(bpfJumpEq, seccomprules.IPProtoMPTCP, "eproto", "allow")

	p.label("ioctl")
	p.op(bpfLoadAbs, argHigh(1), "", "")
	p.op(bpfJumpEq, 0, "", "allow")
	p.op(bpfLoadAbs, argLow(1), "", "")
	p.op(bpfJumpEq, seccomprules.TIOCSTI, "eperm", "allow")

	p.label("eperm")
	p.op(bpfReturn, unix.SECCOMP_RET_ERRNO|uint32(unix.EPERM), "", "")
	p.label("eproto")
	p.op(bpfReturn, unix.SECCOMP_RET_ERRNO|uint32(unix.EPROTONOSUPPORT), "", "")
	p.label("allow") // last, so that every jump goes forwards
	p.op(bpfReturn, unix.SECCOMP_RET_ALLOW, "", "")
	return p.assemble()
}

// DropSysAdmin removes CAP_SYS_ADMIN from every thread's bounding,
// effective, permitted and inheritable sets, so nothing envd starts can
// ever hold it. Without the capability it does nothing.
func DropSysAdmin() error {
	if _, _, errno := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, unix.CAP_SYS_ADMIN, 0); errno != 0 && errno != unix.EINVAL {
		return fmt.Errorf("drop CAP_SYS_ADMIN from the bounding set: %w", errno)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	bit := uint32(1) << (unix.CAP_SYS_ADMIN % 32)
	i := unix.CAP_SYS_ADMIN / 32
	if (data[i].Effective|data[i].Permitted|data[i].Inheritable)&bit == 0 {
		return nil
	}
	data[i].Effective &^= bit
	data[i].Permitted &^= bit
	data[i].Inheritable &^= bit
	if _, _, errno := syscall.AllThreadsSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); errno != 0 {
		return fmt.Errorf("capset: %w", errno)
	}
	return nil
}
