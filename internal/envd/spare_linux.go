package envd

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/api/gen/process"
)

// Starting a reaper costs an exec of envd and a Go runtime start, a few
// milliseconds that every command paid on its critical path. envd keeps one
// reaper started ahead ("envd reap --spare"): it waits on a socket for its
// command (argv, env, cwd, credentials, stdio and its two pipes to envd),
// takes the command's session, terminal and user, then reaps it like any
// reaper. The next spare starts off the critical path once commands come in
// succession (a command took the last spare, or came within spareIdle of the
// one before): a sandbox that ran one command keeps no spare, and an unused
// spare ends after spareIdle, so idle sandboxes keep no extra process (each
// costs memory and a handful of host pids).
//
// The spare is a fresh exec of envd started by the server: it holds no
// secret (envd's token lives only in the server's memory). It runs as root,
// which only sandbox root can reach, and starts the command as its user.

const (
	// spareIdle is how long an unused spare reaper waits before envd ends it.
	spareIdle = 30 * time.Second
	// maxSpareRequest bounds one request datagram; a command whose
	// argv/env is bigger starts a reaper of its own instead.
	maxSpareRequest = 128 << 10
	// spareSocketFD is the spare's end of its socket to envd.
	spareSocketFD = 3
)

// spareRequest is the command a spare reaper takes. Its stdin, stdout,
// stderr, status and control files travel beside it (SCM_RIGHTS), in that
// order.
type spareRequest struct {
	Argv []string `json:"argv"`
	Env  []string `json:"env"`
	Dir  string   `json:"dir"`
	// SetCred switches to UID, GID and Groups; otherwise the reaper stays
	// root with envd's groups, as a command run as root does.
	SetCred bool     `json:"setCred"`
	UID     uint32   `json:"uid"`
	GID     uint32   `json:"gid"`
	Groups  []uint32 `json:"groups"`
	// Ctty makes stdin (a terminal) the session's controlling terminal.
	Ctty bool `json:"ctty"`
}

// spareReaper is envd's side of one started spare.
type spareReaper struct {
	cmd      *exec.Cmd
	sock     *os.File
	children *Children
}

// spares holds at most one spare reaper of the envd binary exe.
type spares struct {
	exe      string
	children *Children

	mu       sync.Mutex
	spare    *spareReaper
	starting bool
	closed   bool
	idle     *time.Timer
	last     time.Time // of the previous take
}

// take returns the spare, or nil when none is ready, and starts the next one
// in the background when commands come in succession.
func (sp *spares) take() *spareReaper {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	r := sp.spare
	sp.spare = nil
	if sp.idle != nil {
		sp.idle.Stop()
		sp.idle = nil
	}
	now := time.Now()
	succession := r != nil || (!sp.last.IsZero() && now.Sub(sp.last) < spareIdle)
	sp.last = now
	if succession && !sp.starting && !sp.closed && sp.exe != "" {
		sp.starting = true
		go sp.refill()
	}
	return r
}

// refill starts a spare and parks it; one that is never taken ends after
// spareIdle.
func (sp *spares) refill() {
	r, err := startSpare(sp.exe, sp.children)
	sp.mu.Lock()
	defer sp.mu.Unlock()
	sp.starting = false
	if err != nil {
		return // the next command starts its own reaper
	}
	if sp.closed || sp.spare != nil {
		r.discard()
		return
	}
	sp.spare = r
	sp.idle = time.AfterFunc(spareIdle, func() {
		sp.mu.Lock()
		defer sp.mu.Unlock()
		if sp.spare == r {
			sp.spare = nil
			sp.idle = nil
			r.discard()
		}
	})
}

// forget starts over as if no command had run: /init starts a sandbox (or
// one restored from a snapshot taken amid commands), which has no commands
// in succession yet.
func (sp *spares) forget() {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	sp.last = time.Time{}
	sp.dropLocked()
}

// close ends the parked spare and starts no more.
func (sp *spares) close() {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	sp.closed = true
	sp.dropLocked()
}

// dropLocked ends the parked spare, if any, and its idle timer.
func (sp *spares) dropLocked() {
	if sp.spare != nil {
		sp.spare.discard()
		sp.spare = nil
	}
	if sp.idle != nil {
		sp.idle.Stop()
		sp.idle = nil
	}
}

// startSpare starts "exe reap --spare" with its socket on fd 3.
func startSpare(exe string, children *Children) (*spareReaper, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("spare reaper socket: %w", err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "spare"), os.NewFile(uintptr(fds[1]), "spare")
	defer theirs.Close()
	cmd := exec.Command(exe, "reap", "--spare")
	cmd.Env = []string{}
	cmd.ExtraFiles = []*os.File{theirs}
	cmd.Stderr = os.Stderr // a Go runtime failure before it takes a command
	if err := children.Start(cmd, cmd.Start); err != nil {
		ours.Close()
		return nil, fmt.Errorf("start spare reaper: %w", err)
	}
	return &spareReaper{cmd: cmd, sock: ours, children: children}, nil
}

// discard ends an unused spare: it exits when its socket closes.
func (r *spareReaper) discard() {
	r.sock.Close()
	go func() { _ = r.children.Wait(r.cmd) }()
}

// errSpareGone means the spare could not take the command (it died or its
// request would not fit); nothing was started and the caller starts a
// reaper of its own.
var errSpareGone = errors.New("spare reaper unavailable")

// hand gives the spare its command. files are stdin, stdout, stderr, status
// and control, in that order. On errSpareGone the spare is discarded.
func (r *spareReaper) hand(req *spareRequest, files []*os.File) error {
	b, err := json.Marshal(req)
	if err == nil && len(b) > maxSpareRequest {
		err = fmt.Errorf("request of %d bytes", len(b))
	}
	if err == nil {
		fds := make([]int, len(files))
		for i, f := range files {
			fds[i] = int(f.Fd())
		}
		err = unix.Sendmsg(int(r.sock.Fd()), b, unix.UnixRights(fds...), nil, unix.MSG_NOSIGNAL)
	}
	r.sock.Close()
	if err != nil {
		go func() { _ = r.children.Wait(r.cmd) }()
		return fmt.Errorf("%w: %v", errSpareGone, err)
	}
	return nil
}

// RunSpareReaper is "envd reap --spare": it waits for its command on fd 3,
// takes on the command's session, terminal and user, and reaps it like
// RunReaper. It exits quietly if envd closes the socket first.
func RunSpareReaper() int {
	buf := make([]byte, maxSpareRequest)
	oob := make([]byte, unix.CmsgSpace(5*4))
	var n, oobn int
	var err error
	for {
		n, oobn, _, _, err = unix.Recvmsg(spareSocketFD, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil || n == 0 {
		return 0
	}
	var fds []int
	if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
		for _, m := range msgs {
			if rights, err := unix.ParseUnixRights(&m); err == nil {
				fds = append(fds, rights...)
			}
		}
	}
	if len(fds) != 5 {
		fmt.Fprintf(os.Stderr, "envd reap --spare: got %d files, want 5\n", len(fds))
		return 2
	}
	// Move the files clear of 0-4, then into place: stdio on 0-2, the
	// status and control pipes on 3 and 4 (the socket's slot), as for
	// "envd reap --".
	for i, fd := range fds {
		hi, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 10)
		if err != nil {
			return 2
		}
		unix.Close(fd)
		fds[i] = hi
	}
	for i, fd := range fds {
		if err := unix.Dup3(fd, i, 0); err != nil {
			return 2
		}
		unix.Close(fd)
	}
	status := os.NewFile(reaperStatusFD, "status")
	fail := func(format string, a ...any) int {
		fmt.Fprintf(status, "err %s\n", strings.ReplaceAll(fmt.Sprintf(format, a...), "\n", " "))
		return 127
	}
	var req spareRequest
	if err := json.Unmarshal(buf[:n], &req); err != nil || len(req.Argv) == 0 {
		return fail("spare reaper: malformed request")
	}
	if _, err := unix.Setsid(); err != nil {
		return fail("setsid: %v", err)
	}
	if req.Ctty {
		if err := unix.IoctlSetInt(0, unix.TIOCSCTTY, 0); err != nil {
			return fail("set controlling terminal: %v", err)
		}
	}
	// The command (not the reaper) takes the user, in the forked child:
	// switching a running Go process's credentials signals every one of
	// its threads, which costs milliseconds on a loaded host. The reaper
	// stays root, so unlike a fresh one its command cannot kill it.
	sys := &syscall.SysProcAttr{}
	if req.SetCred {
		sys.Credential = &syscall.Credential{Uid: req.UID, Gid: req.GID, Groups: req.Groups}
	}
	return runReaper(req.Argv, req.Env, req.Dir, sys)
}

// startOnSpare hands cmd (configured as for a reaper of its own) to the
// spare reaper, if one is ready, with new stdio for it. handed is false when
// no spare took it: nothing was started and cmd is untouched.
func (s *Server) startOnSpare(cmd *exec.Cmd, req *process.StartRequest, p *proc, statusW, controlR *os.File) (readers []io.ReadCloser, kinds []string, handed bool) {
	sp := s.spares.take()
	if sp == nil {
		return nil, nil, false
	}
	sr := &spareRequest{Argv: append([]string{cmd.Path}, cmd.Args[1:]...), Env: cmd.Env, Dir: cmd.Dir}
	if c := cmd.SysProcAttr.Credential; c != nil {
		sr.SetCred, sr.UID, sr.GID, sr.Groups = true, c.Uid, c.Gid, c.Groups
	}
	var child []*os.File // the command's ends, closed here once sent
	closeAll := func(fs []*os.File) {
		for _, f := range fs {
			if f != nil {
				f.Close()
			}
		}
	}
	var ours []*os.File
	if req.Pty != nil {
		ptmx, tty, err := pty.Open()
		if err != nil {
			sp.discard()
			return nil, nil, false
		}
		_ = pty.Setsize(ptmx, ptySize(req.Pty))
		sr.Ctty = true
		child, ours = []*os.File{tty, tty, tty}, []*os.File{ptmx}
		readers, kinds = []io.ReadCloser{ptmx}, []string{"pty"}
	} else {
		outR, outW, err1 := os.Pipe()
		errR, errW, err2 := os.Pipe()
		var inR, inW *os.File
		var err3 error
		if req.Stdin == nil || *req.Stdin {
			inR, inW, err3 = os.Pipe()
		} else {
			inR, err3 = os.Open(os.DevNull)
		}
		child, ours = []*os.File{inR, outW, errW}, []*os.File{outR, errR, inW}
		if err := errors.Join(err1, err2, err3); err != nil {
			closeAll(child)
			closeAll(ours)
			sp.discard()
			return nil, nil, false
		}
		readers, kinds = []io.ReadCloser{outR, errR}, []string{"stdout", "stderr"}
		p.stdin = inW
	}
	err := sp.hand(sr, append(child[:3:3], statusW, controlR))
	if child[0] == child[1] {
		child = child[:1] // one terminal
	}
	closeAll(child)
	if err != nil {
		closeAll(ours)
		p.stdin = nil
		return nil, nil, false
	}
	if req.Pty != nil {
		p.tty = ours[0]
	}
	p.cmd = sp.cmd
	return readers, kinds, true
}
