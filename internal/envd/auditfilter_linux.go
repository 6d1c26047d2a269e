package envd

import (
	"fmt"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
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
// x86_64 syscalls nrs with EPERM and asks the kernel to log each refusal.
func LogRefusals(nrs []uint32) error {
	if len(nrs) == 0 || len(nrs) > 200 {
		return fmt.Errorf("audit filter: %d syscalls, want 1 to 200", len(nrs))
	}
	prog := refusalFilter(nrs)
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

// Classic BPF over struct seccomp_data: nr at offset 0, arch at offset 4.
const (
	bpfLoadAbs = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
	bpfJumpEq  = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
	bpfReturn  = unix.BPF_RET | unix.BPF_K
)

// refusalFilter: other architectures and calls pass (the runtime's filter
// rules on them); the listed x86_64 calls get EPERM.
func refusalFilter(nrs []uint32) []unix.SockFilter {
	n := len(nrs)
	prog := []unix.SockFilter{
		{Code: bpfLoadAbs, K: 4},
		{Code: bpfJumpEq, K: unix.AUDIT_ARCH_X86_64, Jt: 0, Jf: uint8(n + 1)},
		{Code: bpfLoadAbs, K: 0},
	}
	for i, nr := range nrs {
		prog = append(prog, unix.SockFilter{Code: bpfJumpEq, K: nr, Jt: uint8(n - i), Jf: 0})
	}
	return append(prog,
		unix.SockFilter{Code: bpfReturn, K: unix.SECCOMP_RET_ALLOW},
		unix.SockFilter{Code: bpfReturn, K: unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)},
	)
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
