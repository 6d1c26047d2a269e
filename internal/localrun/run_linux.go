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
	// The masks are mounted by now and their inodes outlive their names:
	// remove them at once, so an agentbox killed later leaves nothing.
	os.RemoveAll(masks)
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
