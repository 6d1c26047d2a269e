package localrun

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// Securebits of <linux/securebits.h>.
const (
	secbitNoRoot       = 1 << 0
	secbitNoRootLocked = 1 << 1
)

// RunInit is the helper: in the new namespaces it brings loopback up,
// opens the proxy's listening socket, mounts the masks, restricts itself
// with Landlock and seccomp, passes the socket and the seccomp listener to
// agentbox on fd 3, and execs the command. It returns only on failure.
func RunInit(arg string) error {
	var sp spec
	if err := json.Unmarshal([]byte(arg), &sp); err != nil {
		return fmt.Errorf("run-init: bad spec: %w", err)
	}
	if len(sp.Args) == 0 {
		return errors.New("run-init: no command")
	}
	// Securebits, ambient capabilities, no_new_privs, Landlock and the
	// seccomp filter are all per thread: set them on the thread that execs,
	// or the command may run with none of them.
	runtime.LockOSThread()
	sock := os.NewFile(3, "run-child")
	if err := loopbackUp(); err != nil {
		return err
	}
	lc := net.ListenConfig{}
	lc.SetMultipathTCP(false)
	ln, err := lc.Listen(context.Background(), "tcp4", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("run-init: proxy socket: %w", err)
	}
	proxy := "http://" + ln.Addr().String()
	lnFile, err := ln.(*net.TCPListener).File()
	if err != nil {
		return fmt.Errorf("run-init: %w", err)
	}
	ln.Close()
	if err := mountMasks(sp); err != nil {
		return err
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("run-init: clearing capabilities: %w", err)
	}
	if os.Getuid() == 0 {
		// root (mapped to itself) would get every capability of the user
		// namespace back at the exec; NOROOT keeps the command without.
		if err := unix.Prctl(unix.PR_SET_SECUREBITS, secbitNoRoot|secbitNoRootLocked, 0, 0, 0); err != nil {
			return fmt.Errorf("run-init: securebits: %w", err)
		}
	}
	path, err := exec.LookPath(sp.Args[0])
	if err != nil {
		return fmt.Errorf("%s: %w", sp.Args[0], err)
	}
	env := append(os.Environ(),
		"HTTP_PROXY="+proxy, "HTTPS_PROXY="+proxy, "http_proxy="+proxy, "https_proxy="+proxy,
		"ALL_PROXY="+proxy, "NO_PROXY=localhost,127.0.0.1", "no_proxy=localhost,127.0.0.1",
		"AGENTBOX_TIER=process")
	if !sp.NoLandlock {
		if err := applyLandlock(sp.Plan); err != nil {
			return err
		}
	}
	// The filter goes on this thread alone, which then execs.
	nfd, err := installFilter(sp.Explain)
	if err != nil {
		return err
	}
	rights := unix.UnixRights(int(lnFile.Fd()), nfd)
	if err := unix.Sendmsg(int(sock.Fd()), []byte{0}, rights, nil, 0); err != nil {
		return fmt.Errorf("run-init: passing descriptors: %w", err)
	}
	unix.Close(nfd)
	lnFile.Close()
	sock.Close()
	return syscall.Exec(path, sp.Args, env)
}

// loopbackUp brings up lo in the new network namespace.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("run-init: loopback: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("run-init: loopback flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("run-init: bringing loopback up: %w", err)
	}
	return nil
}

// mountMasks mounts an unreadable, read-only empty file or directory over
// each denied path inside a writable directory.
func mountMasks(sp spec) error {
	if len(sp.Plan.Masks) == 0 && len(sp.Plan.ReadOnly) == 0 {
		return nil
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("run-init: private mounts: %w", err)
	}
	for _, m := range sp.Plan.Masks {
		fi, err := os.Stat(m)
		if err != nil {
			continue
		}
		src := sp.MaskFile
		if fi.IsDir() {
			src = sp.MaskDir
		}
		if err := bindReadOnly(src, m); err != nil {
			return fmt.Errorf("run-init: masking %s: %w", m, err)
		}
	}
	for _, r := range sp.Plan.ReadOnly {
		if err := bindReadOnly(r, r); err != nil {
			return fmt.Errorf("run-init: keeping %s read-only: %w", r, err)
		}
	}
	return nil
}

// bindReadOnly bind-mounts src on target, read-only.
func bindReadOnly(src, target string) error {
	if err := unix.Mount(src, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return err
	}
	var st unix.Statfs_t
	if err := unix.Statfs(target, &st); err != nil {
		return err
	}
	// A remount must keep the flags the source mount locks.
	keep := uintptr(st.Flags) & (unix.ST_NOSUID | unix.ST_NODEV | unix.ST_NOEXEC | unix.ST_NOATIME | unix.ST_NODIRATIME | unix.ST_RELATIME)
	return unix.Mount("", target, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|keep, "")
}
