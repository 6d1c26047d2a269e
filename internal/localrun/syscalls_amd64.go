package localrun

import "golang.org/x/sys/unix"

// ownSyscalls are the x86_64 numbers of the calls this tier adds to the
// container tier's list (internal/seccomprules names those).
var ownSyscalls = map[string]uint32{
	"ptrace": unix.SYS_PTRACE, "process_vm_readv": unix.SYS_PROCESS_VM_READV,
	"process_vm_writev": unix.SYS_PROCESS_VM_WRITEV, "connect": unix.SYS_CONNECT,
	"open": unix.SYS_OPEN, "openat": unix.SYS_OPENAT, "creat": unix.SYS_CREAT,
	"mkdir": unix.SYS_MKDIR, "mkdirat": unix.SYS_MKDIRAT, "unlink": unix.SYS_UNLINK,
	"unlinkat": unix.SYS_UNLINKAT, "rmdir": unix.SYS_RMDIR, "rename": unix.SYS_RENAME,
	"renameat": unix.SYS_RENAMEAT, "renameat2": unix.SYS_RENAMEAT2, "truncate": unix.SYS_TRUNCATE,
	"link": unix.SYS_LINK, "linkat": unix.SYS_LINKAT, "symlink": unix.SYS_SYMLINK,
	"symlinkat": unix.SYS_SYMLINKAT, "mknod": unix.SYS_MKNOD, "mknodat": unix.SYS_MKNODAT,
}

const auditArch = unix.AUDIT_ARCH_X86_64
