package seccomprules

import "golang.org/x/sys/unix"

// SyscallName names the x86_64 syscalls the container tier's filter can
// refuse; others are reported by number.
func SyscallName(nr int) string {
	switch nr {
	case unix.SYS_ADD_KEY:
		return "add_key"
	case unix.SYS_KEYCTL:
		return "keyctl"
	case unix.SYS_REQUEST_KEY:
		return "request_key"
	case unix.SYS_BPF:
		return "bpf"
	case unix.SYS_PERF_EVENT_OPEN:
		return "perf_event_open"
	case unix.SYS_USERFAULTFD:
		return "userfaultfd"
	case unix.SYS_LOOKUP_DCOOKIE:
		return "lookup_dcookie"
	case unix.SYS_KCMP:
		return "kcmp"
	case unix.SYS_INIT_MODULE:
		return "init_module"
	case unix.SYS_FINIT_MODULE:
		return "finit_module"
	case unix.SYS_DELETE_MODULE:
		return "delete_module"
	case unix.SYS_CREATE_MODULE:
		return "create_module"
	case unix.SYS_QUERY_MODULE:
		return "query_module"
	case unix.SYS_GET_KERNEL_SYMS:
		return "get_kernel_syms"
	case unix.SYS_KEXEC_LOAD:
		return "kexec_load"
	case unix.SYS_KEXEC_FILE_LOAD:
		return "kexec_file_load"
	case unix.SYS_REBOOT:
		return "reboot"
	case unix.SYS_SWAPON:
		return "swapon"
	case unix.SYS_SWAPOFF:
		return "swapoff"
	case unix.SYS_ACCT:
		return "acct"
	case unix.SYS_SYSLOG:
		return "syslog"
	case unix.SYS_MOUNT:
		return "mount"
	case unix.SYS_UMOUNT2:
		return "umount2"
	case unix.SYS_PIVOT_ROOT:
		return "pivot_root"
	case unix.SYS_UNSHARE:
		return "unshare"
	case unix.SYS_SETNS:
		return "setns"
	case unix.SYS_FSOPEN:
		return "fsopen"
	case unix.SYS_FSCONFIG:
		return "fsconfig"
	case unix.SYS_FSMOUNT:
		return "fsmount"
	case unix.SYS_FSPICK:
		return "fspick"
	case unix.SYS_MOVE_MOUNT:
		return "move_mount"
	case unix.SYS_OPEN_TREE:
		return "open_tree"
	case unix.SYS_MOUNT_SETATTR:
		return "mount_setattr"
	case unix.SYS_OPEN_BY_HANDLE_AT:
		return "open_by_handle_at"
	case unix.SYS_NAME_TO_HANDLE_AT:
		return "name_to_handle_at"
	case unix.SYS_SETTIMEOFDAY:
		return "settimeofday"
	case unix.SYS_CLOCK_SETTIME:
		return "clock_settime"
	case unix.SYS_CLOCK_ADJTIME:
		return "clock_adjtime"
	case unix.SYS_MBIND:
		return "mbind"
	case unix.SYS_SET_MEMPOLICY:
		return "set_mempolicy"
	case unix.SYS_GET_MEMPOLICY:
		return "get_mempolicy"
	case unix.SYS_MOVE_PAGES:
		return "move_pages"
	case unix.SYS_MIGRATE_PAGES:
		return "migrate_pages"
	case unix.SYS_IOPERM:
		return "ioperm"
	case unix.SYS_IOPL:
		return "iopl"
	case unix.SYS_USELIB:
		return "uselib"
	case unix.SYS_USTAT:
		return "ustat"
	case unix.SYS_SYSFS:
		return "sysfs"
	case unix.SYS__SYSCTL:
		return "_sysctl"
	case unix.SYS_NFSSERVCTL:
		return "nfsservctl"
	case unix.SYS_QUOTACTL:
		return "quotactl"
	case unix.SYS_QUOTACTL_FD:
		return "quotactl_fd"
	case unix.SYS_IO_URING_SETUP:
		return "io_uring_setup"
	case unix.SYS_IO_URING_ENTER:
		return "io_uring_enter"
	case unix.SYS_IO_URING_REGISTER:
		return "io_uring_register"
	case unix.SYS_FANOTIFY_INIT:
		return "fanotify_init"
	case unix.SYS_CLONE:
		return "clone"
	case unix.SYS_CLONE3:
		return "clone3"
	case unix.SYS_SOCKET:
		return "socket"
	case unix.SYS_IOCTL:
		return "ioctl"
	}
	return ""
}

// SyscallNumber is the x86_64 number of a syscall the container tier's
// filter can refuse, by name.
func SyscallNumber(name string) (int, bool) {
	for nr := range 1024 {
		if SyscallName(nr) == name {
			return nr, true
		}
	}
	return 0, false
}
