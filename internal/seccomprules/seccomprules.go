// Package seccomprules is the container tier's seccomp policy, in one
// place: the refused syscalls and argument rules, the reason given for each
// refusal, the OCI profile the runtime puts in every bundle, and the syscall
// names and numbers. envd stacks a logging copy of the same rules (see
// internal/envd/auditfilter_linux.go) and internal/seccomplog names and
// explains the refusals with it: all of them must refuse exactly the same
// calls with the same errors.
package seccomprules

import (
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// NamespaceCloneFlags are refused in clone(2): a new namespace is an
// escape surface (user namespaces above all), and the sandbox already has
// its own.
func NamespaceCloneFlags() []uint64 {
	return []uint64{
		unix.CLONE_NEWNS, unix.CLONE_NEWCGROUP, unix.CLONE_NEWUTS, unix.CLONE_NEWIPC,
		unix.CLONE_NEWUSER, unix.CLONE_NEWPID, unix.CLONE_NEWNET, unix.CLONE_NEWTIME,
	}
}

// IPProtoMPTCP is IPPROTO_MPTCP, the third argument of socket(2), refused
// with EPROTONOSUPPORT: MPTCP sockets bypass Landlock's TCP rules and
// cannot be checkpointed.
const IPProtoMPTCP = 262

// TIOCSTI, the second argument of ioctl(2), is refused with EPERM: it
// pushes bytes into another process's terminal input.
const TIOCSTI = unix.TIOCSTI

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
//
// The reasons below word the "syscall" audit events of internal/seccomplog.

// deniedGroup is a set of syscalls refused with EPERM for one reason.
type deniedGroup struct {
	reason string // completes "refused by the sandbox's seccomp policy (...)"
	names  []string
}

// deniedGroups fail with EPERM: they reach kernel state shared with the host
// (keyrings, modules, mounts, namespaces, clocks, BPF, perf) or are classic
// container-escape primitives (open_by_handle_at).
var deniedGroups = []deniedGroup{
	{"kernel keyrings are shared with the host and not allowed in sandboxes",
		[]string{"add_key", "keyctl", "request_key"}},
	{"loading eBPF programs is not allowed in sandboxes", []string{"bpf"}},
	{"kernel performance counters are not allowed in sandboxes", []string{"perf_event_open"}},
	{"userfaultfd is not allowed in sandboxes", []string{"userfaultfd"}},
	{"kernel introspection is not allowed in sandboxes", []string{"lookup_dcookie", "kcmp", "syslog"}},
	{"loading kernel modules is not allowed in sandboxes",
		[]string{"init_module", "finit_module", "delete_module", "create_module", "query_module", "get_kernel_syms"}},
	{"rebooting or replacing the kernel is not allowed in sandboxes", []string{"kexec_load", "kexec_file_load", "reboot"}},
	{"host-wide swap and process accounting are not allowed in sandboxes", []string{"swapon", "swapoff", "acct"}},
	// the runtime sets mounts and namespaces up before this filter applies
	{"mounting and namespace changes are not allowed in sandboxes; the filesystem is set up at creation",
		[]string{"mount", "umount", "umount2", "pivot_root", "unshare", "setns",
			"fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr"}},
	// file handles bypass the mount namespace ("shocker")
	{"opening files by handle bypasses the sandbox's filesystem view and is not allowed",
		[]string{"open_by_handle_at", "name_to_handle_at"}},
	{"the clock is shared with the host and cannot be set from a sandbox",
		[]string{"settimeofday", "clock_settime", "clock_adjtime", "stime"}},
	{"NUMA memory policy is not allowed in sandboxes",
		[]string{"mbind", "set_mempolicy", "get_mempolicy", "move_pages", "migrate_pages"}},
	{"raw hardware access is not allowed in sandboxes", []string{"ioperm", "iopl", "vm86", "vm86old"}},
	{"obsolete kernel interface, not allowed in sandboxes",
		[]string{"uselib", "ustat", "sysfs", "_sysctl", "nfsservctl", "quotactl", "quotactl_fd"}},
	// io_uring performs its operations where this filter cannot see them
	{"io_uring is not allowed in sandboxes; use ordinary read/write/poll",
		[]string{"io_uring_setup", "io_uring_enter", "io_uring_register"}},
	{"fanotify is not allowed in sandboxes; use inotify", []string{"fanotify_init"}},
}

// Reasons of the conditional rules (Profile).
const (
	reasonClone3   = "clone3 is answered ENOSYS so that libc falls back to clone, whose flags the filter can check"
	reasonCloneNS  = "creating namespaces is not allowed in sandboxes"
	reasonMPTCP    = "MPTCP sockets are not allowed in sandboxes; use TCP"
	reasonIoctl    = "TIOCSTI terminal input injection is not allowed in sandboxes"
	reasonFallback = "the call is not allowed in sandboxes"
)

// Reason says why the container tier's filter refuses the syscall
// named name, in words an agent can act on.
func Reason(name string) string {
	switch name {
	case "clone3":
		return reasonClone3
	case "clone":
		return reasonCloneNS
	case "socket":
		return reasonMPTCP
	case "ioctl":
		return reasonIoctl
	}
	for _, g := range deniedGroups {
		for _, n := range g.names {
			if n == name {
				return g.reason
			}
		}
	}
	return reasonFallback
}

// DeniedSyscalls lists every name of deniedGroups.
func DeniedSyscalls() []string {
	var out []string
	for _, g := range deniedGroups {
		out = append(out, g.names...)
	}
	return out
}

// Profile returns the container tier's filter.
func Profile() *specs.LinuxSeccomp {
	eperm := uint(unix.EPERM)
	enosys := uint(unix.ENOSYS)
	eproto := uint(unix.EPROTONOSUPPORT)
	sc := &specs.LinuxSeccomp{
		DefaultAction: specs.ActAllow,
		Architectures: []specs.Arch{specs.ArchX86_64, specs.ArchX86, specs.ArchX32},
		// No Flags: Debian's runc 1.1.5 refuses SECCOMP_FILTER_FLAG_LOG,
		// so envd stacks a logging copy of the unconditional refusals
		// (see AuditedSyscalls and internal/envd/auditfilter_linux.go).
		Syscalls: []specs.LinuxSyscall{
			{Names: DeniedSyscalls(), Action: specs.ActErrno, ErrnoRet: &eperm},
			// clone3 passes its flags in memory, where seccomp cannot look;
			// ENOSYS makes libc fall back to clone, which is checked below.
			{Names: []string{"clone3"}, Action: specs.ActErrno, ErrnoRet: &enosys},
			{Names: []string{"socket"}, Action: specs.ActErrno, ErrnoRet: &eproto,
				Args: []specs.LinuxSeccompArg{{Index: 2, Value: IPProtoMPTCP, Op: specs.OpEqualTo}}},
			// TIOCSTI pushes bytes into another process's terminal input.
			{Names: []string{"ioctl"}, Action: specs.ActErrno, ErrnoRet: &eperm,
				Args: []specs.LinuxSeccompArg{{Index: 1, Value: TIOCSTI, Op: specs.OpEqualTo}}},
		},
	}
	for _, f := range NamespaceCloneFlags() {
		// Separate rules for one syscall are OR-ed: any namespace flag refuses.
		sc.Syscalls = append(sc.Syscalls, specs.LinuxSyscall{
			Names: []string{"clone"}, Action: specs.ActErrno, ErrnoRet: &eperm,
			Args: []specs.LinuxSeccompArg{{Index: 0, Value: f, ValueTwo: f, Op: specs.OpMaskedEqual}},
		})
	}
	return sc
}

// AuditedSyscalls lists the x86_64 numbers of the unconditionally refused
// syscalls, comma-separated ("" where unknown): envd's --audit-syscalls.
func AuditedSyscalls() string {
	var nrs []string
	for _, name := range DeniedSyscalls() {
		if nr, ok := SyscallNumber(name); ok {
			nrs = append(nrs, strconv.Itoa(nr))
		}
	}
	return strings.Join(nrs, ",")
}
