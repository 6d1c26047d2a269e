package localrun

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/network"
)

// InitHook is the name of the helper `agentbox __hook run-init <spec>`,
// which agentbox starts in the command's new namespaces: it sets them up,
// restricts itself and execs the command.
const InitHook = "run-init"

// Options configure one run.
type Options struct {
	Config Config
	Env    Env
	Args   []string // the command and its arguments
	// Self is the agentbox binary, re-executed as the namespace helper.
	Self   string
	Stderr io.Writer    // explanations, "agentbox: ..." lines
	Log    *slog.Logger // a record of every refusal and proxy decision
	// ExplainFiles predicts and explains Landlock refusals of file calls;
	// it sends every open through agentbox (slower; see docs).
	ExplainFiles bool
	// AllowNoLandlock runs without Landlock where the kernel lacks it:
	// writes are not restricted and every denied path is masked instead.
	AllowNoLandlock bool
}

// spec is what the helper needs, passed as its argument.
type spec struct {
	Plan       Plan     `json:"plan"`
	Args       []string `json:"args"`
	MaskFile   string   `json:"mask_file"`
	MaskDir    string   `json:"mask_dir"`
	Explain    bool     `json:"explain"`
	NoLandlock bool     `json:"no_landlock"`
}

// Preflight says why this kernel cannot give a command its own user and
// network namespaces.
func Preflight() error {
	root := os.Geteuid() == 0
	if b, err := os.ReadFile("/proc/sys/kernel/unprivileged_userns_clone"); err == nil && strings.TrimSpace(string(b)) == "0" && !root {
		return errors.New("unprivileged user namespaces are disabled (kernel.unprivileged_userns_clone=0), so the command cannot get its own network namespace; enable them with sysctl kernel.unprivileged_userns_clone=1")
	}
	if b, err := os.ReadFile("/proc/sys/kernel/apparmor_restrict_unprivileged_userns"); err == nil && strings.TrimSpace(string(b)) == "1" && !root {
		return errors.New("AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns=1), so the command cannot get its own network namespace; allow agentbox with an AppArmor profile that has \"userns,\"")
	}
	if b, err := os.ReadFile("/proc/sys/user/max_user_namespaces"); err == nil && strings.TrimSpace(string(b)) == "0" {
		return errors.New("user namespaces are disabled (user.max_user_namespaces=0), so the command cannot get its own network namespace; raise user.max_user_namespaces")
	}
	return nil
}

// abiGaps says what Landlock ABI abi leaves unrestricted that a newer one
// would restrict, or "".
func abiGaps(abi int) string {
	var gaps []string
	for _, g := range []struct {
		since int
		what  string
	}{{3, "truncating files"}, {5, "device ioctls"}, {6, "signals and abstract unix sockets to outside processes"}} {
		if abi < g.since {
			gaps = append(gaps, fmt.Sprintf("%s (ABI %d)", g.what, g.since))
		}
	}
	return strings.Join(gaps, ", ")
}

// Run runs the command and returns its exit code.
func Run(ctx context.Context, o Options) (int, error) {
	if len(o.Args) == 0 {
		return 0, errors.New("no command given; use: agentbox run -- CMD [ARGS]")
	}
	if err := Preflight(); err != nil {
		return 0, err
	}
	say := func(line string) { fmt.Fprintln(o.Stderr, "agentbox:", line) }
	abi, llErr := LandlockABI()
	switch {
	case llErr != nil && !o.AllowNoLandlock:
		return 0, fmt.Errorf("%w; --allow-no-landlock runs without it (writes unrestricted, denied paths masked)", llErr)
	case llErr != nil:
		say("running without Landlock (" + llErr.Error() + "): writes are not restricted")
	case abiGaps(abi) != "":
		say(fmt.Sprintf("this kernel has Landlock ABI %d, which does not restrict %s", abi, abiGaps(abi)))
	}
	o.Log.Info("landlock", "abi", abi, "available", llErr == nil)
	plan, err := BuildPlan(o.Config, o.Env)
	if err != nil {
		return 0, err
	}
	if llErr != nil {
		// Without Landlock only the masks deny reads, and nothing writes.
		plan.Masks = plan.Masks[:0]
		for _, d := range plan.Denied {
			plan.Masks = append(plan.Masks, d.Path)
		}
		plan.Read, plan.Listable, plan.Write = []string{"/"}, nil, []string{"/"}
	}
	domains := make([]string, 0, len(o.Config.AllowNet))
	for i, d := range o.Config.AllowNet {
		d, err := network.ParseDomain(fmt.Sprintf("--allow-net[%d]", i), d)
		if err != nil {
			return 0, err
		}
		domains = append(domains, d)
	}

	masks, err := os.MkdirTemp("", "agentbox-run-")
	if err != nil {
		return 0, fmt.Errorf("mask directory: %w", err)
	}
	defer os.RemoveAll(masks)
	sp := spec{Plan: plan, Args: o.Args, MaskFile: filepath.Join(masks, "f"), MaskDir: filepath.Join(masks, "d"),
		Explain: o.ExplainFiles, NoLandlock: llErr != nil}
	if err := os.WriteFile(sp.MaskFile, nil, 0); err != nil {
		return 0, fmt.Errorf("mask file: %w", err)
	}
	if err := os.Mkdir(sp.MaskDir, 0); err != nil {
		return 0, fmt.Errorf("mask directory: %w", err)
	}
	js, err := json.Marshal(sp)
	if err != nil {
		return 0, err
	}

	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("socketpair: %w", err)
	}
	parent, child := os.NewFile(uintptr(pair[0]), "run-parent"), os.NewFile(uintptr(pair[1]), "run-child")
	defer parent.Close()

	uid, gid := os.Getuid(), os.Getgid()
	cmd := exec.Command(o.Self, "__hook", InitHook, string(js))
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.ExtraFiles = []*os.File{child}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:                 syscall.CLONE_NEWUSER | syscall.CLONE_NEWNET | syscall.CLONE_NEWNS,
		UidMappings:                []syscall.SysProcIDMap{{ContainerID: uid, HostID: uid, Size: 1}},
		GidMappings:                []syscall.SysProcIDMap{{ContainerID: gid, HostID: gid, Size: 1}},
		GidMappingsEnableSetgroups: false,
		// The helper needs these in its own namespaces to bring up
		// loopback and mount the masks; it clears them before the exec.
		AmbientCaps: []uintptr{unix.CAP_NET_ADMIN, unix.CAP_SYS_ADMIN},
		Pdeathsig:   syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		child.Close()
		return 0, fmt.Errorf("starting the namespace helper: %w (this needs user namespaces)", err)
	}
	child.Close()

	fds, err := recvFDs(parent, 2)
	if err != nil {
		// The helper failed and said why on stderr; return its status.
		werr := cmd.Wait()
		var ee *exec.ExitError
		if errors.As(werr, &ee) {
			return 0, &HelperError{Code: ee.ExitCode()}
		}
		return 0, fmt.Errorf("namespace helper: %w", err)
	}
	lnFile := os.NewFile(uintptr(fds[0]), "proxy-listener")
	ln, err := net.FileListener(lnFile)
	lnFile.Close()
	if err != nil {
		unix.Close(fds[1])
		cmd.Process.Kill()
		cmd.Wait()
		return 0, fmt.Errorf("proxy listener: %w", err)
	}
	proxyAddr := "http://" + ln.Addr().String()

	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	proxy := &Proxy{Allow: network.Policy{AllowDomains: domains}, Refuse: say, Log: o.Log}
	wg.Go(func() { proxy.Serve(runCtx, ln) })
	ex := &Explainer{Plan: plan, Proxy: proxyAddr, Out: say, Log: o.Log}
	wg.Go(func() { ex.Serve(runCtx, fds[1]) })

	// The command shares agentbox's process group, so the terminal's
	// SIGINT and SIGQUIT reach it directly: agentbox only outlives them.
	// SIGTERM and SIGHUP sent to agentbox alone are passed on.
	signal.Ignore(syscall.SIGINT, syscall.SIGQUIT)
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		for s := range sigs {
			cmd.Process.Signal(s)
		}
	}()
	werr := cmd.Wait()
	signal.Stop(sigs)
	close(sigs)
	ln.Close()
	cancel()
	wg.Wait()
	if werr == nil {
		return 0, nil
	}
	var ee *exec.ExitError
	if errors.As(werr, &ee) {
		if st, ok := ee.Sys().(syscall.WaitStatus); ok && st.Signaled() {
			return 128 + int(st.Signal()), nil
		}
		return ee.ExitCode(), nil
	}
	return 0, werr
}

// Securebits of <linux/securebits.h>.
const (
	secbitNoRoot       = 1 << 0
	secbitNoRootLocked = 1 << 1
)

// HelperError is the exit status of a helper that failed before the
// command started; it printed the reason.
type HelperError struct{ Code int }

func (e *HelperError) Error() string {
	return "setup failed (exit status " + strconv.Itoa(e.Code) + ")"
}

// recvFDs receives n descriptors from the helper; it returns an error
// when the helper exits first (its end of the socketpair closes).
func recvFDs(f *os.File, n int) ([]int, error) {
	buf := make([]byte, 1)
	oob := make([]byte, unix.CmsgSpace(4*n))
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	var oobn int
	var rerr error
	err = rc.Read(func(fd uintptr) bool {
		_, oobn, _, _, rerr = unix.Recvmsg(int(fd), buf, oob, unix.MSG_CMSG_CLOEXEC)
		return rerr != unix.EAGAIN
	})
	if err == nil {
		err = rerr
	}
	if err != nil {
		return nil, err
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return nil, errors.New("the helper exited before passing its descriptors")
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != n {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, fmt.Errorf("the helper passed %d descriptors, want %d", len(fds), n)
	}
	return fds, nil
}

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
	runtime.LockOSThread()
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
