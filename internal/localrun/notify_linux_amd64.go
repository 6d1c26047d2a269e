package localrun

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/seccomprules"
)

// seccompNotif is struct seccomp_notif.
type seccompNotif struct {
	ID    uint64
	PID   uint32
	Flags uint32
	Nr    int32
	Arch  uint32
	IP    uint64
	Args  [6]uint64
}

// seccompNotifResp is struct seccomp_notif_resp.
type seccompNotifResp struct {
	ID    uint64
	Val   int64
	Error int32
	Flags uint32
}

// Explainer answers the filter's notifications: it refuses the policy's
// syscalls with their error, and for file and connect calls predicts a
// Landlock or network refusal and says so on stderr, once per path.
type Explainer struct {
	Plan  Plan
	Proxy string // the proxy address the command was given, for the hint
	Out   func(line string)
	Log   *slog.Logger

	mu   sync.Mutex
	seen map[string]bool
}

// Serve answers notifications on fd until no process uses the filter any
// more or ctx ends, and closes fd.
func (e *Explainer) Serve(ctx context.Context, fd int) {
	defer unix.Close(fd)
	// Linux 6.6+: the caller hands its CPU to this loop and back, instead
	// of two scheduler wake-ups per call (every open waits on this loop).
	// Older kernels refuse the flag; it only costs speed.
	unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SECCOMP_IOCTL_NOTIF_SET_FLAGS, unix.SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP)
	for ctx.Err() == nil {
		// A blocked ioctl would not notice ctx; poll with a bound.
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(pfd, 200)
		if err == unix.EINTR || n == 0 {
			continue
		}
		if err != nil || pfd[0].Revents&(unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0 && pfd[0].Revents&unix.POLLIN == 0 {
			return
		}
		var req seccompNotif
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SECCOMP_IOCTL_NOTIF_RECV, uintptr(unsafe.Pointer(&req))); errno != 0 {
			continue // ENOENT: the caller died; EINTR: try again
		}
		resp := e.answer(&req)
		resp.ID = req.ID
		// ENOENT here too means the caller died meanwhile.
		unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SECCOMP_IOCTL_NOTIF_SEND, uintptr(unsafe.Pointer(&resp)))
	}
}

func (e *Explainer) answer(n *seccompNotif) seccompNotifResp {
	cont := seccompNotifResp{Flags: unix.SECCOMP_USER_NOTIF_FLAG_CONTINUE}
	name := syscallName(n.Nr)
	pid := int(n.PID)
	a := n.Args
	switch name {
	case "connect":
		e.explainConnect(pid, a[1], a[2])
		return cont
	case "open":
		e.explainPath(pid, name, unix.AT_FDCWD, a[0], isWriteOpen(a[1]))
		return cont
	case "openat":
		e.explainPath(pid, name, int32(a[0]), a[1], isWriteOpen(a[2]))
		return cont
	case "creat", "mkdir", "unlink", "rmdir", "truncate", "mknod":
		e.explainPath(pid, name, unix.AT_FDCWD, a[0], true)
		return cont
	case "mkdirat", "unlinkat", "mknodat":
		e.explainPath(pid, name, int32(a[0]), a[1], true)
		return cont
	case "rename", "link":
		e.explainPath(pid, name, unix.AT_FDCWD, a[0], name == "rename")
		e.explainPath(pid, name, unix.AT_FDCWD, a[1], true)
		return cont
	case "renameat", "renameat2", "linkat":
		e.explainPath(pid, name, int32(a[0]), a[1], name != "linkat")
		e.explainPath(pid, name, int32(a[2]), a[3], true)
		return cont
	case "symlink":
		e.explainPath(pid, name, unix.AT_FDCWD, a[1], true)
		return cont
	case "symlinkat":
		e.explainPath(pid, name, int32(a[1]), a[2], true)
		return cont
	}
	errno := unix.EPERM
	if name == "socket" && a[2] == seccomprules.IPProtoMPTCP {
		errno = unix.EPROTONOSUPPORT
	}
	if name == "" {
		name = "syscall " + strconv.Itoa(int(n.Nr))
	}
	e.say(fmt.Sprintf("%s refused: %s; the process tier has no flag to allow it, use a container sandbox (agentbox create)", name, reasonFor(name)),
		"kind", "syscall", "syscall", name, "pid", pid)
	return seccompNotifResp{Error: -int32(errno)}
}

func isWriteOpen(flags uint64) bool {
	return flags&(unix.O_WRONLY|unix.O_RDWR|unix.O_CREAT|unix.O_TRUNC) != 0
}

// explainPath resolves the path argument at addr as the caller sees it
// and says whether the plan refuses it.
func (e *Explainer) explainPath(pid int, call string, dirfd int32, addr uint64, write bool) {
	p, err := readString(pid, addr)
	if err != nil || p == "" {
		return
	}
	if !filepath.IsAbs(p) {
		base := fmt.Sprintf("/proc/%d/cwd", pid)
		if dirfd != unix.AT_FDCWD {
			base = fmt.Sprintf("/proc/%d/fd/%d", pid, dirfd)
		}
		dir, err := os.Readlink(base)
		if err != nil {
			return
		}
		p = filepath.Join(dir, p)
	}
	p = filepath.Clean(p)
	if real, err := filepath.EvalSymlinks(p); err == nil {
		p = real
	} else if !write {
		return // a read of a missing file fails with ENOENT anyway
	} else if dir, err := filepath.EvalSymlinks(filepath.Dir(p)); err == nil {
		p = filepath.Join(dir, filepath.Base(p))
	}
	if why := e.Plan.Refusal(p, write); why != "" {
		// One line per --write hint: a tool writing a thousand files
		// under a cache directory needs to be told once.
		key := why
		if write && !underAny(p, e.Plan.Write) {
			key = "write " + e.Plan.WriteHint(p)
		}
		e.sayOnce(key, why, "kind", "file", "syscall", call, "path", p, "write", write, "pid", pid)
	}
}

// explainConnect says why a connection leaving loopback fails.
func (e *Explainer) explainConnect(pid int, addr, size uint64) {
	if size < 8 || size > 128 {
		return
	}
	b := make([]byte, size)
	if err := readMem(pid, addr, b); err != nil {
		return
	}
	var dst netip.AddrPort
	switch binary.NativeEndian.Uint16(b) {
	case unix.AF_UNIX:
		path := string(b[2:])
		if i := strings.IndexByte(path, 0); i >= 0 {
			path = path[:i]
		}
		if path == "" || !filepath.IsAbs(path) {
			return // abstract (scoped by Landlock) or relative
		}
		for _, d := range e.Plan.Denied {
			if path == d.Path || under(path, d.Path) {
				e.say(fmt.Sprintf("connection to the unix socket %s refused: it is hidden by the rule %q (agent and service sockets would let the command act outside the sandbox); allow it with --read %s",
					path, d.Rule, d.Path), "kind", "net", "socket", path, "pid", pid)
				return
			}
		}
		return
	case unix.AF_INET:
		dst = netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[4:8])), binary.BigEndian.Uint16(b[2:4]))
	case unix.AF_INET6:
		if size < 24 {
			return
		}
		dst = netip.AddrPortFrom(netip.AddrFrom16([16]byte(b[8:24])).Unmap(), binary.BigEndian.Uint16(b[2:4]))
	default:
		return
	}
	if dst.Addr().IsLoopback() || dst.Addr().IsUnspecified() {
		return
	}
	e.say(fmt.Sprintf("connection to %s refused: the command's network has no route out; the only way out is the proxy %s (HTTP_PROXY, HTTPS_PROXY), for domains allowed with --allow-net DOMAIN",
		dst, e.Proxy), "kind", "net", "dst", dst.String(), "pid", pid)
}

// say prints an explanation line once, and logs it as a record each time.
func (e *Explainer) say(line string, attrs ...any) { e.sayOnce(line, line, attrs...) }

// sayOnce logs line as a record, and prints it the first time key is
// seen.
func (e *Explainer) sayOnce(key, line string, attrs ...any) {
	e.mu.Lock()
	if e.seen == nil {
		e.seen = map[string]bool{}
	}
	dup := e.seen[key]
	e.seen[key] = true
	e.mu.Unlock()
	if e.Log != nil {
		e.Log.Warn("refused", append(attrs, "explanation", line)...)
	}
	if !dup && e.Out != nil {
		e.Out(line)
	}
}

// readString reads a NUL-terminated string of at most PATH_MAX bytes
// from pid's memory.
func readString(pid int, addr uint64) (string, error) {
	var out []byte
	var page [4096]byte
	for len(out) < unix.PathMax {
		// Stop at page ends: the next page may be unmapped.
		n := min(4096-int(addr%4096), 256)
		buf := page[:n]
		if err := readMem(pid, addr, buf); err != nil {
			return "", err
		}
		if i := bytes.IndexByte(buf, 0); i >= 0 {
			return string(append(out, buf[:i]...)), nil
		}
		out = append(out, buf...)
		addr += uint64(n)
	}
	return "", errors.New("path too long")
}

func readMem(pid int, addr uint64, b []byte) error {
	local := []unix.Iovec{{Base: &b[0], Len: uint64(len(b))}}
	remote := []unix.RemoteIovec{{Base: uintptr(addr), Len: len(b)}}
	n, err := unix.ProcessVMReadv(pid, local, remote, 0)
	if err != nil {
		return err
	}
	if n != len(b) {
		return errors.New("short read")
	}
	return nil
}
