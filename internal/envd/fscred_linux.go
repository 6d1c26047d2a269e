package envd

import (
	"fmt"
	"runtime"
	"syscall"
	"unsafe"
)

// asUser runs fn on a locked OS thread whose filesystem credentials are the
// user's (setfsuid/setfsgid and supplementary groups, set with raw syscalls
// so they apply to this thread only). The kernel then checks permissions as
// for the user and drops root's file capabilities, and new files are owned by
// the user. For root fn runs unchanged.
func asUser(u *User, fn func() error) error {
	if u == nil || u.UID == 0 {
		return fn()
	}
	runtime.LockOSThread()
	if err := setThreadCreds(u.UID, u.GID, u.Groups); err != nil {
		// A half-switched thread must not serve anyone else: leaving it
		// locked makes the runtime discard it when this goroutine ends.
		return fmt.Errorf("switch to user %s: %w", u.Name, err)
	}
	fnErr := fn()
	if err := setThreadCreds(0, 0, nil); err != nil {
		return fmt.Errorf("restore credentials: %w", err)
	}
	runtime.UnlockOSThread()
	return fnErr
}

func setThreadCreds(uid, gid uint32, groups []uint32) error {
	if euid, _, _ := syscall.RawSyscall(syscall.SYS_GETEUID, 0, 0, 0); uid == 0 && euid != 0 {
		// Undo the effective-id fallback below first: while it is in
		// force the thread has no capabilities to change anything else.
		syscall.RawSyscall(syscall.SYS_SETRESUID, ^uintptr(0), 0, ^uintptr(0))
		syscall.RawSyscall(syscall.SYS_SETRESGID, ^uintptr(0), 0, ^uintptr(0))
	}
	var p unsafe.Pointer
	if len(groups) > 0 {
		p = unsafe.Pointer(&groups[0])
	}
	if _, _, e := syscall.RawSyscall(syscall.SYS_SETGROUPS, uintptr(len(groups)), uintptr(p), 0); e != 0 {
		return fmt.Errorf("setgroups: %w", e)
	}
	// setfsuid/setfsgid report the previous id, never an error; verify by
	// reading back with an invalid id.
	syscall.RawSyscall(syscall.SYS_SETFSGID, uintptr(gid), 0, 0)
	syscall.RawSyscall(syscall.SYS_SETFSUID, uintptr(uid), 0, 0)
	fsuid, _, _ := syscall.RawSyscall(syscall.SYS_SETFSUID, ^uintptr(0), 0, 0)
	fsgid, _, _ := syscall.RawSyscall(syscall.SYS_SETFSGID, ^uintptr(0), 0, 0)
	if uint32(fsuid) == uid && uint32(fsgid) == gid {
		return nil
	}
	// gVisor does not implement filesystem ids. Switch this thread's
	// effective ids instead (raw syscalls: this thread only), keeping real
	// and saved ids 0 so the switch back above is allowed.
	if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESGID, ^uintptr(0), uintptr(gid), ^uintptr(0)); e != 0 {
		return fmt.Errorf("setfsgid %d did not take effect, and setresgid: %w", gid, e)
	}
	if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESUID, ^uintptr(0), uintptr(uid), ^uintptr(0)); e != 0 {
		return fmt.Errorf("setfsuid %d did not take effect, and setresuid: %w", uid, e)
	}
	if cur, _, _ := syscall.RawSyscall(syscall.SYS_GETEUID, 0, 0, 0); uint32(cur) != uid {
		return fmt.Errorf("neither setfsuid nor setresuid %d took effect", uid)
	}
	return nil
}
