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
	if cur, _, _ := syscall.RawSyscall(syscall.SYS_SETFSUID, ^uintptr(0), 0, 0); uint32(cur) != uid {
		return fmt.Errorf("setfsuid %d did not take effect", uid)
	}
	if cur, _, _ := syscall.RawSyscall(syscall.SYS_SETFSGID, ^uintptr(0), 0, 0); uint32(cur) != gid {
		return fmt.Errorf("setfsgid %d did not take effect", gid)
	}
	return nil
}
