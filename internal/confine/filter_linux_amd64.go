package confine

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/seccomprules"
)

// ownDenied are refused beyond the container tier's list: the tool needs no
// network, no other process and no new one (threads pass: clone with
// CLONE_THREAD; debugfs reads bitmaps in threads).
var ownDenied = []uint32{
	unix.SYS_SOCKET, unix.SYS_SOCKETPAIR, unix.SYS_CONNECT,
	unix.SYS_FORK, unix.SYS_VFORK,
	unix.SYS_PTRACE, unix.SYS_PROCESS_VM_READV, unix.SYS_PROCESS_VM_WRITEV,
	unix.SYS_KILL, unix.SYS_TKILL, unix.SYS_TGKILL, unix.SYS_EXECVE, unix.SYS_EXECVEAT,
}

// filter refuses the calls with EPERM (x86_64 only: other architectures
// and the x32 ABI kill the tool). It is installed just before the exec of
// the tool, so execve stays allowed; Landlock gives write access to no
// binary, so a later exec can only run a system tool, as the same
// confined uid, under the same filter and limits.
func filter() ([]unix.SockFilter, error) {
	// The exec of the tool itself must pass.
	return filterProg(true)
}

// filterProg refuses ownDenied, the container tier's list and extra;
// allowExec keeps execve.
func filterProg(allowExec bool, extra ...uint32) ([]unix.SockFilter, error) {
	denied := append(append([]uint32{}, ownDenied...), extra...)
	for _, n := range seccomprules.DeniedSyscalls() {
		if nr, ok := seccomprules.SyscallNumber(n); ok {
			denied = append(denied, uint32(nr))
		}
	}
	var keep []uint32
	for _, nr := range denied {
		if nr != unix.SYS_EXECVE || !allowExec {
			keep = append(keep, nr)
		}
	}
	denied = keep
	if len(denied) > 200 {
		return nil, fmt.Errorf("confine: %d refused syscalls is too many for 8-bit jumps", len(denied))
	}
	const (
		ld   = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeq  = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		jge  = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
		jset = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
		ret  = unix.BPF_RET | unix.BPF_K
	)
	n := len(denied)
	// 0: arch, 1: arch check, 2: nr, 3: x32 check, 4: clone3, 5: clone,
	// 6..6+n-1: denials, then allow, deny, kill, enosys, and clone's
	// flags check (load, CLONE_THREAD set: allow, else deny).
	allow := 6 + n
	deny, kill, enosys, cloneFlags := allow+1, allow+2, allow+3, allow+4
	prog := []unix.SockFilter{
		{Code: ld, K: 4},
		{Code: jeq, K: unix.AUDIT_ARCH_X86_64, Jt: 0, Jf: uint8(kill - 2)},
		{Code: ld, K: 0},
		{Code: jge, K: 0x40000000, Jt: uint8(kill - 4), Jf: 0},
		// clone3's flags are in memory the filter cannot read: ENOSYS
		// makes the C library fall back to clone.
		{Code: jeq, K: unix.SYS_CLONE3, Jt: uint8(enosys - 5)},
		{Code: jeq, K: unix.SYS_CLONE, Jt: uint8(cloneFlags - 6)},
	}
	for i, nr := range denied {
		at := 6 + i
		prog = append(prog, unix.SockFilter{Code: jeq, K: nr, Jt: uint8(deny - at - 1)})
	}
	prog = append(prog,
		unix.SockFilter{Code: ret, K: unix.SECCOMP_RET_ALLOW},
		unix.SockFilter{Code: ret, K: unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)},
		unix.SockFilter{Code: ret, K: unix.SECCOMP_RET_KILL_PROCESS},
		unix.SockFilter{Code: ret, K: unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)},
		unix.SockFilter{Code: ld, K: 16}, // clone's flags, low 32 bits
		// CLONE_THREAD set: a thread of the tool's own (classic BPF
		// jumps forward only, so the verdicts follow again).
		unix.SockFilter{Code: jset, K: unix.CLONE_THREAD, Jt: 0, Jf: 1},
		unix.SockFilter{Code: ret, K: unix.SECCOMP_RET_ALLOW},
		unix.SockFilter{Code: ret, K: unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)},
	)
	return prog, nil
}

// installFilter sets no_new_privs and the filter on the calling thread,
// which then execs the tool.
func installFilter() error {
	prog, err := filter()
	if err != nil {
		return err
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("confine: no_new_privs: %w", err)
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	if _, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&fprog))); errno != 0 {
		return fmt.Errorf("confine: seccomp: %w", errno)
	}
	return nil
}
