package envd

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/api/gen/process"
)

// Starting a reaper costs an exec of envd and a Go runtime start: a few
// milliseconds in a container, tens inside gVisor's Sentry, where every
// fault of a new process is a hand-off to the Sentry. So reapers are
// reused: envd starts "envd reap --spare", which waits on a socket for a
// command (argv, env, cwd, credentials, terminal, stdio and its two pipes
// to envd), reaps it like any reaper and, once the command and everything
// it started are gone, waits for the next one. A reaper only takes a
// command when it has no descendant left, so a command's tree is still
// exactly its reaper's descendants: the kill and the lifetime cap end what
// the command started and nothing else.
//
// A freed reaper is parked for the next command when commands come in
// succession (its command came within spareIdle of the one before), and
// ends after spareIdle unused: a sandbox that ran one command keeps no
// extra process (each costs memory and a handful of host pids). At most
// one is parked; a command that finds none starts one on its way, and
// commands that overlap each have their own.
//
// The reaper leads a session of its own, and so of every command it runs:
// a session whose leader lives as long as anything the command started is
// one CRIU can checkpoint and restore (a session whose leader has exited
// cannot be restored). A session keeps the first terminal it takes, so a
// reaper that gave a command a terminal ends after it instead of serving
// again.
//
// A reaper is a fresh exec of envd started by the server: it holds no
// secret (envd's token lives only in the server's memory). It runs as root,
// which only sandbox root can reach, and starts each command as its user.

const (
	// spareIdle is how long an unused reaper stays parked before envd ends it.
	spareIdle = 30 * time.Second
	// maxSpareRequest bounds one request datagram; a command whose
	// argv/env is bigger starts a reaper of its own instead.
	maxSpareRequest = 128 << 10
	// spareSocketFD is the reaper's end of its socket to envd.
	spareSocketFD = 3
)

// spareRequest is the command a reaper takes. Its stdin, stdout, stderr,
// status and control files travel beside it (SCM_RIGHTS), in that order.
type spareRequest struct {
	Argv []string `json:"argv"`
	Env  []string `json:"env"`
	Dir  string   `json:"dir"`
	// SetCred switches to UID, GID and Groups; otherwise the command runs
	// as root with envd's groups.
	SetCred bool     `json:"setCred"`
	UID     uint32   `json:"uid"`
	GID     uint32   `json:"gid"`
	Groups  []uint32 `json:"groups"`
	// Ctty makes stdin (a terminal) the session's controlling terminal.
	Ctty bool `json:"ctty"`
}

// spareReaper is envd's side of one reusable reaper.
type spareReaper struct {
	cmd  *exec.Cmd
	sock *os.File
	gone chan struct{} // closed once the reaper has exited and was waited for
}

// spares holds at most one free reaper of the envd binary exe (empty:
// every command starts under a reaper of its own, "envd reap --").
type spares struct {
	exe      string
	children *Children

	mu     sync.Mutex
	spare  *spareReaper
	closed bool
	idle   *time.Timer
	last   time.Time // of the previous take
}

// take returns the parked reaper, or nil when none is, and whether the
// reaper that runs this command is to be parked after it: commands come in
// succession.
func (sp *spares) take() (r *spareReaper, keep bool) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	r = sp.spare
	sp.spare = nil
	if sp.idle != nil {
		sp.idle.Stop()
		sp.idle = nil
	}
	now := time.Now()
	keep = r != nil || (!sp.last.IsZero() && now.Sub(sp.last) < spareIdle)
	sp.last = now
	return r, keep
}

// put parks r, whose command's tree is gone, for the next command; one that
// is never taken ends after spareIdle. r ends instead when a reaper is
// parked already, envd is closing, or r died.
func (sp *spares) put(r *spareReaper) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	select {
	case <-r.gone:
		return
	default:
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

// close ends the parked reaper and parks no more.
func (sp *spares) close() {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	sp.closed = true
	sp.dropLocked()
}

// dropLocked ends the parked reaper, if any, and its idle timer.
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
		return nil, fmt.Errorf("reaper socket: %w", err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "spare"), os.NewFile(uintptr(fds[1]), "spare")
	defer theirs.Close()
	cmd := exec.Command(exe, "reap", "--spare")
	cmd.Env = []string{}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.ExtraFiles = []*os.File{theirs}
	cmd.Stderr = os.Stderr // a Go runtime failure
	if err := children.Start(cmd, cmd.Start); err != nil {
		ours.Close()
		return nil, fmt.Errorf("start reaper: %w", err)
	}
	r := &spareReaper{cmd: cmd, sock: ours, gone: make(chan struct{})}
	go func() {
		_ = children.Wait(cmd)
		close(r.gone)
	}()
	return r, nil
}

// discard ends a free reaper: it exits when its socket closes.
func (r *spareReaper) discard() {
	r.sock.Close()
}

// errSpareGone means the reaper could not take the command (it died or its
// request would not fit); nothing was started and the caller starts a
// reaper of its own.
var errSpareGone = errors.New("spare reaper unavailable")

// hand gives the reaper its command. files are stdin, stdout, stderr,
// status and control, in that order. On errSpareGone the reaper is
// discarded.
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
	if err != nil {
		r.discard()
		return fmt.Errorf("%w: %v", errSpareGone, err)
	}
	return nil
}

// RunSpareReaper is "envd reap --spare", started as a session leader: it
// takes commands from fd 3, one at a time, and reaps each like RunReaper.
// It exits quietly when envd closes the socket, and after a command it
// gave a terminal.
func RunSpareReaper() int {
	r, err := newReaper()
	if err != nil {
		fmt.Fprintln(os.Stderr, "envd reap --spare:", err)
		return 127
	}
	buf := make([]byte, maxSpareRequest)
	oob := make([]byte, unix.CmsgSpace(5*4))
	for {
		var n, oobn int
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
		stdio := []*os.File{os.NewFile(uintptr(fds[0]), "stdin"), os.NewFile(uintptr(fds[1]), "stdout"), os.NewFile(uintptr(fds[2]), "stderr")}
		job := reapJob{stdio: stdio, status: os.NewFile(uintptr(fds[3]), "status"), control: controlFile(fds[4]),
			releaseStdio: func() {
				for _, f := range stdio {
					f.Close()
				}
			}}
		var req spareRequest
		if err := json.Unmarshal(buf[:n], &req); err != nil || len(req.Argv) == 0 {
			job.releaseStdio()
			job.control.Close()
			fmt.Fprintln(job.status, "err reaper: malformed request")
			job.status.Close()
			continue
		}
		if req.Ctty {
			if err := unix.IoctlSetInt(int(stdio[0].Fd()), unix.TIOCSCTTY, 0); err != nil {
				job.releaseStdio()
				job.control.Close()
				fmt.Fprintf(job.status, "err set controlling terminal: %v\n", err)
				job.status.Close()
				return 127
			}
		}
		// The command (not the reaper) takes the user, in the forked
		// child: switching a running Go process's credentials signals
		// every one of its threads. The reaper stays root, so the command
		// cannot kill it.
		job.sys = &syscall.SysProcAttr{}
		if req.SetCred {
			job.sys.Credential = &syscall.Credential{Uid: req.UID, Gid: req.GID, Groups: req.Groups}
		}
		job.argv, job.env, job.dir = req.Argv, req.Env, req.Dir
		r.run(job)
		if req.Ctty {
			return 0 // the session keeps that terminal
		}
	}
}

// startOnSpare hands cmd (configured as for a reaper of its own) to a
// reusable reaper, the parked one or a new one, with new stdio for it.
// handed is false when no reaper took it: nothing was started and cmd is
// untouched.
func (s *Server) startOnSpare(cmd *exec.Cmd, req *process.StartRequest, p *proc, statusW, controlR *os.File) (readers []io.ReadCloser, kinds []string, handed bool) {
	sp, keep := s.spares.take()
	if sp == nil {
		if s.spares.exe == "" {
			return nil, nil, false
		}
		var err error
		if sp, err = startSpare(s.spares.exe, s.children); err != nil {
			s.log.Warn("starting the command under a reaper of its own", "err", err)
			return nil, nil, false
		}
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
	// A reaper that gave a terminal ends after its command.
	p.cmd, p.spare, p.keepSpare = sp.cmd, sp, keep && req.Pty == nil
	return readers, kinds, true
}
