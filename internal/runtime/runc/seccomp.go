package runc

import (
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// Seccomp profile of the container tier.
//
// It refuses what Docker's default profile refuses to a container without
// CAP_SYS_ADMIN, plus what this platform must never allow (MPTCP sockets,
// which bypass Landlock TCP rules and cannot be checkpointed; io_uring; the
// new mount API; TIOCSTI terminal injection). It is written as a deny list
// over an allow default rather than Docker's 350-name allow list: the kernel
// compiles it in a fraction of the time (start latency, see bench), and
// every entry below is a decision someone can read. Unknown architectures
// are refused outright (libseccomp kills on a foreign arch), so 32-bit and
// x32 entry points cannot route around the names.

// deniedSyscalls fail with EPERM: they reach kernel state shared with the
// host (keyrings, modules, mounts, namespaces, clocks, BPF, perf) or are
// classic container-escape primitives (open_by_handle_at).
var deniedSyscalls = []string{
	// kernel keyrings are not namespaced
	"add_key", "keyctl", "request_key",
	// kernel extension and introspection
	"bpf", "perf_event_open", "userfaultfd", "lookup_dcookie", "kcmp",
	"init_module", "finit_module", "delete_module", "create_module", "query_module", "get_kernel_syms",
	"kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff", "acct", "syslog",
	// mounts and namespaces: the runtime sets them up before this filter applies
	"mount", "umount", "umount2", "pivot_root", "unshare", "setns",
	"fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr",
	// file handles bypass the mount namespace ("shocker")
	"open_by_handle_at", "name_to_handle_at",
	// clocks are host-wide
	"settimeofday", "clock_settime", "clock_adjtime", "stime",
	// NUMA policy and raw hardware access
	"mbind", "set_mempolicy", "get_mempolicy", "move_pages", "migrate_pages",
	"ioperm", "iopl", "vm86", "vm86old",
	// obsolete interfaces with a history of bugs
	"uselib", "ustat", "sysfs", "_sysctl", "nfsservctl", "quotactl", "quotactl_fd",
	// io_uring bypasses this filter for the operations it performs
	"io_uring_setup", "io_uring_enter", "io_uring_register",
	"fanotify_init",
}

// namespaceCloneFlags are refused in clone(2): a new namespace is an escape
// surface (user namespaces above all), and the sandbox already has its own.
var namespaceCloneFlags = []uint64{
	unix.CLONE_NEWNS, unix.CLONE_NEWCGROUP, unix.CLONE_NEWUTS, unix.CLONE_NEWIPC,
	unix.CLONE_NEWUSER, unix.CLONE_NEWPID, unix.CLONE_NEWNET, unix.CLONE_NEWTIME,
}

// ipprotoMPTCP is IPPROTO_MPTCP, the third argument of socket(2).
const ipprotoMPTCP = 262

// seccompProfile returns the container tier's filter.
func seccompProfile() *specs.LinuxSeccomp {
	eperm := uint(unix.EPERM)
	enosys := uint(unix.ENOSYS)
	eproto := uint(unix.EPROTONOSUPPORT)
	sc := &specs.LinuxSeccomp{
		DefaultAction: specs.ActAllow,
		Architectures: []specs.Arch{specs.ArchX86_64, specs.ArchX86, specs.ArchX32},
		Syscalls: []specs.LinuxSyscall{
			{Names: deniedSyscalls, Action: specs.ActErrno, ErrnoRet: &eperm},
			// clone3 passes its flags in memory, where seccomp cannot look;
			// ENOSYS makes libc fall back to clone, which is checked below.
			{Names: []string{"clone3"}, Action: specs.ActErrno, ErrnoRet: &enosys},
			{Names: []string{"socket"}, Action: specs.ActErrno, ErrnoRet: &eproto,
				Args: []specs.LinuxSeccompArg{{Index: 2, Value: ipprotoMPTCP, Op: specs.OpEqualTo}}},
			// TIOCSTI pushes bytes into another process's terminal input.
			{Names: []string{"ioctl"}, Action: specs.ActErrno, ErrnoRet: &eperm,
				Args: []specs.LinuxSeccompArg{{Index: 1, Value: unix.TIOCSTI, Op: specs.OpEqualTo}}},
		},
	}
	for _, f := range namespaceCloneFlags {
		// Separate rules for one syscall are OR-ed: any namespace flag refuses.
		sc.Syscalls = append(sc.Syscalls, specs.LinuxSyscall{
			Names: []string{"clone"}, Action: specs.ActErrno, ErrnoRet: &eperm,
			Args: []specs.LinuxSeccompArg{{Index: 0, Value: f, ValueTwo: f, Op: specs.OpMaskedEqual}},
		})
	}
	return sc
}
