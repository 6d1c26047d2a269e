package envd

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A command's lifetime cap (and an explicit kill) must end everything the
// command started, including children that left its process group with
// setsid or double-forked away from it. envd runs every command under a
// reaper, "envd reap -- argv...": a child subreaper, so every process the
// command starts stays its descendant whatever it does, orphans included.
// The reaper reports the command's own exit to envd on fd 3 and stays until
// the last descendant is gone (a command's background daemons keep running
// after it returns, as in E2B); a byte on fd 4 makes it stop and kill the
// whole tree. If sandbox code kills a reaper, its descendants fall to envd,
// a subreaper too, which kills them (adopt.go).
//
// Messages on fd 3, one per line: "pid <n>" once the command started, or
// "err <message>" if it could not; then "exit <wait status>". The pipe
// closes once the command and everything it started are gone.

// reaperStatusFD and reaperControlFD are the reaper's pipes to envd.
const (
	reaperStatusFD  = 3
	reaperControlFD = 4
)

// RunReaper is "envd reap [--cred uid:gid[:group,...]] -- argv...", args
// being what follows "reap". It returns the reaper's exit code. With
// --cred the reaper stays root and the command takes those ids, as with a
// spare reaper: the reaper can put the command in the user cgroup, which
// only root may do (usercgroup_linux.go), and the command cannot kill it.
func RunReaper(args []string) int {
	var sys *syscall.SysProcAttr
	if len(args) > 1 && args[0] == "--cred" {
		c, err := parseCred(args[1])
		if err != nil {
			fmt.Fprintln(os.Stderr, "envd reap:", err)
			return 2
		}
		sys = &syscall.SysProcAttr{Credential: c}
		args = args[2:]
	}
	if len(args) == 0 || args[0] != "--" {
		fmt.Fprintln(os.Stderr, "envd reap: usage: envd reap [--cred uid:gid[:group,...]] -- command [args...]")
		return 2
	}
	return runReaper(args[1:], os.Environ(), "", sys)
}

// credArg formats c for "envd reap --cred".
func credArg(c *syscall.Credential) string {
	gs := make([]string, len(c.Groups))
	for i, g := range c.Groups {
		gs[i] = strconv.FormatUint(uint64(g), 10)
	}
	return fmt.Sprintf("%d:%d:%s", c.Uid, c.Gid, strings.Join(gs, ","))
}

// parseCred parses credArg's format.
func parseCred(s string) (*syscall.Credential, error) {
	f := strings.SplitN(s, ":", 3)
	if len(f) < 2 {
		return nil, fmt.Errorf("--cred %q: want uid:gid[:group,...]", s)
	}
	var ids []uint32
	for _, v := range f[:2] {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("--cred %q: %w", s, err)
		}
		ids = append(ids, uint32(n))
	}
	c := &syscall.Credential{Uid: ids[0], Gid: ids[1], Groups: []uint32{}}
	if len(f) == 3 && f[2] != "" {
		for _, v := range strings.Split(f[2], ",") {
			n, err := strconv.ParseUint(v, 10, 32)
			if err != nil {
				return nil, fmt.Errorf("--cred %q: %w", s, err)
			}
			c.Groups = append(c.Groups, uint32(n))
		}
	}
	return c, nil
}

// reaper is what a reaper process sets up once for all the commands it
// runs, one at a time: it is a child subreaper, so everything a command
// starts stays its descendant, and it passes the signals it gets on to the
// running command instead of dying.
type reaper struct {
	main atomic.Int64 // the running command's pid; 0 between commands
}

// newReaper makes the calling process a reaper.
func newReaper() (*reaper, error) {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return nil, fmt.Errorf("become a child subreaper: %w", err)
	}
	// Inherited by every command and everything it starts.
	_ = oomBeforeEnvd("self")
	// Handled signals are reset to their defaults in the command by execve.
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2)
	r := &reaper{}
	go func() {
		for s := range sigs {
			if pid := r.main.Load(); pid > 0 {
				_ = syscall.Kill(int(pid), s.(syscall.Signal))
			}
		}
	}()
	return r, nil
}

// reapJob is one command for a reaper.
type reapJob struct {
	argv, env []string
	dir       string // empty: the reaper's own
	sys       *syscall.SysProcAttr
	stdio     []*os.File // the command's stdin, stdout and stderr
	// releaseStdio lets go of the reaper's copies of stdio once the
	// command has its own: they must not keep the output streams open
	// after the command ends while its background processes live on.
	releaseStdio func()
	// status and control are the pipes to envd (closed by run).
	status, control *os.File
}

// run starts j's command and reaps it: "pid <n>" (or "err <message>") on
// the status pipe once it started, "exit <wait status>" when the command
// itself exits, and the pipe closes once the command and everything it
// started are gone, so the reaper is free for another command. A byte on
// the control pipe kills the whole tree. run returns false if the command
// did not start.
func (r *reaper) run(j reapJob) bool {
	defer j.status.Close()
	sys := j.sys
	if sys == nil {
		sys = &syscall.SysProcAttr{}
	}
	// The command runs in the user cgroup; the reaper stays in envd's
	// reserve, so it can report and kill whatever the command does.
	var p *os.Process
	start := func() (err error) {
		p, err = os.StartProcess(j.argv[0], j.argv, &os.ProcAttr{Dir: j.dir, Env: j.env, Sys: sys, Files: j.stdio})
		return err
	}
	// When the user cgroup is full (or nearly: a command that takes its
	// last free pid cannot fork), runaway processes hold it: a fork bomb
	// that outlived the command that started it, so no handle can kill
	// it. The owner's command then starts in the reserve instead, beside
	// the reaper, so the owner can still stop them (`pkill`, `kill -9
	// -1`). It stays within the sandbox's own limits; only envd's process
	// API (the owner) starts commands here, never the runaway code.
	var err error
	if userCgroupFull(cgroupMount) {
		err = start()
	} else if err = startInUserCgroup(cgroupMount, sys, start); errors.Is(err, unix.EAGAIN) {
		err = start()
	}
	if errors.Is(err, unix.EAGAIN) {
		err = fmt.Errorf("%w (the sandbox's process limit is reached: runaway processes hold every pid; kill them, e.g. `pkill -9 -u user` as root, or kill the sandbox)", err)
	}
	j.releaseStdio()
	if err != nil {
		j.control.Close()
		fmt.Fprintf(j.status, "err %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
		return false
	}
	main := p.Pid
	r.main.Store(int64(main))
	fmt.Fprintf(j.status, "pid %d\n", main)
	// The kill must not outlive this command's tree: a reaper free again
	// may be running the next command by then.
	var killMu sync.Mutex
	finished := false
	go func() {
		b := make([]byte, 1)
		if n, _ := j.control.Read(b); n == 1 {
			killMu.Lock()
			if !finished {
				killDescendants(os.Getpid())
			}
			killMu.Unlock()
		}
	}()
	reported := false
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil { // ECHILD: the whole tree is gone
			break
		}
		if pid == main && !reported {
			r.main.Store(0)
			// Most commands leave nothing running: saying so with the
			// exit lets envd free this reaper before the client learns
			// of the end, ready for its next command.
			if reapExited() {
				fmt.Fprintf(j.status, "exit %d %s\n", uint32(ws), treeGoneWord)
				break
			}
			fmt.Fprintf(j.status, "exit %d\n", uint32(ws))
			reported = true
		}
	}
	r.main.Store(0)
	killMu.Lock()
	finished = true
	killMu.Unlock()
	j.control.Close() // ends the control reader (the pipe is non-blocking)
	return true
}

// reapExited reaps the exited children there are and says whether none is
// left. The command's children are the reaper's by the time its exit can be
// waited for (the kernel moves them before it reports the exit).
func reapExited() bool {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		switch {
		case errors.Is(err, syscall.EINTR):
		case err != nil:
			return true // ECHILD
		case pid == 0:
			return false
		}
	}
}

// controlFile wraps fd, the control pipe, non-blocking, so that closing it
// ends a read in progress.
func controlFile(fd int) *os.File {
	_ = unix.SetNonblock(fd, true)
	return os.NewFile(uintptr(fd), "control")
}

// runReaper reaps argv run with env in dir (empty: the reaper's own) with
// sys, as the reaper of one command; the pipes to envd are on fds 3 and 4.
func runReaper(argv, env []string, dir string, sys *syscall.SysProcAttr) int {
	status := os.NewFile(reaperStatusFD, "status")
	if len(argv) == 0 || status == nil {
		fmt.Fprintln(os.Stderr, "envd reap: usage: envd reap -- command [args...] (started by envd with its pipes on fd 3 and 4)")
		return 2
	}
	unix.CloseOnExec(reaperStatusFD)
	unix.CloseOnExec(reaperControlFD)
	r, err := newReaper()
	if err != nil {
		fmt.Fprintf(status, "err %v\n", err)
		return 127
	}
	ok := r.run(reapJob{argv: argv, env: env, dir: dir, sys: sys,
		stdio: []*os.File{os.Stdin, os.Stdout, os.Stderr},
		releaseStdio: func() {
			if null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0); err == nil {
				for fd := range 3 {
					_ = unix.Dup2(int(null.Fd()), fd)
				}
				null.Close()
			}
		},
		status: status, control: controlFile(reaperControlFD)})
	if !ok {
		return 127
	}
	return 0
}

// oomMargin is how much higher than envd's the oom_score_adj of commands
// is. envd is the sandbox's init: if the OOM killer takes it, the sandbox
// ends. The margin adds 30% of the sandbox's memory limit to a command's
// badness over envd's, so a full sandbox loses a command, not envd, unless
// every command is far smaller than envd.
const oomMargin = 300

// oomBeforeEnvd raises the oom_score_adj of pid ("self": the caller), one
// of envd's (inherited from it), by oomMargin, to at most 1000. Raising
// needs no privilege; the process may lower it back to envd's own.
func oomBeforeEnvd(pid string) error {
	path := "/proc/" + pid + "/oom_score_adj"
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	adj, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return os.WriteFile(path, []byte(strconv.Itoa(min(adj+oomMargin, 1000))), 0)
}

// killDescendants ends every descendant of pid: it stops them until no new
// one appears (a stopped process cannot fork), then kills them all.
func killDescendants(pid int) {
	stopped := map[int]bool{}
	for range 1000 {
		fresh := 0
		for _, d := range descendants(pid) {
			if !stopped[d] {
				_ = syscall.Kill(d, syscall.SIGSTOP)
				stopped[d] = true
				fresh++
			}
		}
		if fresh == 0 {
			break
		}
	}
	for d := range stopped {
		_ = syscall.Kill(d, syscall.SIGKILL)
	}
	// Anything that slipped through the last scan.
	for range 100 {
		ds := descendants(pid)
		if len(ds) == 0 {
			return
		}
		for _, d := range ds {
			_ = syscall.Kill(d, syscall.SIGKILL)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// descendants lists the live descendants of pid from /proc.
func descendants(pid int) []int {
	children := map[int][]int{}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pp, ok := parentOf(p); ok {
			children[pp] = append(children[pp], p)
		}
	}
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		c := children[queue[0]]
		queue = append(queue[1:], c...)
		out = append(out, c...)
	}
	return out
}

// parentOf reads a live process's parent pid from /proc/<pid>/stat; zombies
// count as gone.
func parentOf(pid int) (int, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// "pid (comm) state ppid ...": comm may hold spaces and parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 || f[0] == "Z" || f[0] == "X" {
		return 0, false
	}
	pp, err := strconv.Atoi(f[1])
	return pp, err == nil
}

// reaperStatus reads the reaper's first message: the command's pid, or why
// it did not start.
func reaperStarted(r *bufio.Reader) (int, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return 0, fmt.Errorf("the command's reaper ended before starting it: %w", err)
	}
	line = strings.TrimSpace(line)
	if msg, ok := strings.CutPrefix(line, "err "); ok {
		return 0, errors.New(msg)
	}
	if n, ok := strings.CutPrefix(line, "pid "); ok {
		if pid, err := strconv.Atoi(n); err == nil {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("reaper: unexpected message %q", line)
}

// reaperExit reads the command's wait status; ok is false if the reaper
// died without reporting one; gone says the command left nothing running.
func reaperExit(r *bufio.Reader) (ws syscall.WaitStatus, ok, gone bool) {
	line, err := r.ReadString('\n')
	if err != nil {
		return 0, false, false
	}
	n, ok := strings.CutPrefix(strings.TrimSpace(line), "exit ")
	if !ok {
		return 0, false, false
	}
	n, gone = strings.CutSuffix(n, " "+treeGoneWord)
	v, err := strconv.ParseUint(n, 10, 32)
	return syscall.WaitStatus(v), err == nil, gone
}

// treeGoneWord ends the exit message of a command that left nothing
// running: the status pipe closes right after it.
const treeGoneWord = "alone"

// statusString formats a wait status the way Go's ProcessState.String does
// ("exit status 1", "signal: killed"), which E2B clients show.
func statusString(ws syscall.WaitStatus) string {
	switch {
	case ws.Exited():
		return "exit status " + strconv.Itoa(ws.ExitStatus())
	case ws.Signaled():
		s := "signal: " + ws.Signal().String()
		if ws.CoreDump() {
			s += " (core dumped)"
		}
		return s
	}
	return "unknown"
}

// exitCode is ProcessState.ExitCode: -1 for a signal.
func exitCode(ws syscall.WaitStatus) int {
	if ws.Exited() {
		return ws.ExitStatus()
	}
	return -1
}
