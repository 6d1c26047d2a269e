package envd

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/creack/pty"

	"github.com/agentbox/agentbox/api/gen/process"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// defaultKeepalive is the keepalive interval without a Keepalive-Ping-Interval header.
const defaultKeepalive = 90 * time.Second

// drainGrace is how long output readers may keep going after the process
// exits: a background grandchild can hold the pipes open forever.
const drainGrace = 2 * time.Second

// processService implements process.Process.
type processService struct {
	s *Server
}

// rpcUser selects the calling user of an RPC.
func (s *Server) rpcUser(h http.Header) (*User, error) {
	u, err := s.userFromHeader(h, "")
	if err != nil {
		return nil, connect.NewError(connect.CodeUnauthenticated, err)
	}
	return u, nil
}

func (ps *processService) Start(ctx context.Context, req *connect.Request[process.StartRequest], stream *connect.ServerStream[process.StartResponse]) error {
	u, err := ps.s.rpcUser(req.Header())
	if err != nil {
		return err
	}
	p, sub, err := ps.s.startProcess(ctx, u, req.Msg)
	if err != nil {
		return connectError(err)
	}
	return streamEvents(ctx, req.Header(), p, sub, func(ev *process.ProcessEvent) error {
		return stream.Send(&process.StartResponse{Event: ev})
	})
}

func (ps *processService) Connect(ctx context.Context, req *connect.Request[process.ConnectRequest], stream *connect.ServerStream[process.ConnectResponse]) error {
	if _, err := ps.s.rpcUser(req.Header()); err != nil {
		return err
	}
	p, err := ps.s.procs.get(req.Msg.GetProcess())
	if err != nil {
		return connectError(err)
	}
	sub, _ := p.subscribe()
	return streamEvents(ctx, req.Header(), p, sub, func(ev *process.ProcessEvent) error {
		return stream.Send(&process.ConnectResponse{Event: ev})
	})
}

// streamEvents sends start, then output, keepalives after quiet intervals,
// and finally end. It returns when the process ends or the client leaves;
// neither the client leaving nor this function returning stops the process.
func streamEvents(ctx context.Context, h interface{ Get(string) string }, p *proc, sub *subscriber, send func(*process.ProcessEvent) error) error {
	if sub != nil {
		defer p.unsubscribe(sub)
	}
	if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: p.pid}}}); err != nil {
		return err
	}
	ka := keepaliveInterval(h)
	timer := time.NewTimer(ka)
	defer timer.Stop()
	sendEnd := func() error {
		p.mu.Lock()
		end := p.end
		p.mu.Unlock()
		if end.GetError() == context.DeadlineExceeded.Error() {
			_ = send(&process.ProcessEvent{Event: &process.ProcessEvent_End{End: end}})
			return connect.NewError(connect.CodeDeadlineExceeded, fmt.Errorf("process %d killed: its timeout expired", p.pid))
		}
		if p.lifetimeCap > 0 && end.GetError() == capExceededError(p.lifetimeCap) {
			_ = send(&process.ProcessEvent{Event: &process.ProcessEvent_End{End: end}})
			return connect.NewError(connect.CodeDeadlineExceeded, fmt.Errorf("process %d %s", p.pid, end.GetError()))
		}
		return send(&process.ProcessEvent{Event: &process.ProcessEvent_End{End: end}})
	}
	if sub == nil {
		return sendEnd()
	}
	for {
		select {
		case ev := <-sub.ch:
			if err := send(ev); err != nil {
				return err
			}
			timer.Reset(ka)
		case <-p.done:
			for {
				select {
				case ev := <-sub.ch:
					if err := send(ev); err != nil {
						return err
					}
					continue
				default:
				}
				break
			}
			return sendEnd()
		case <-timer.C:
			if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Keepalive{Keepalive: &process.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
			timer.Reset(ka)
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				// The process shares this deadline and is being killed; wait
				// for its end so the client learns the exit state.
				select {
				case <-p.done:
					return sendEnd()
				case <-time.After(5 * time.Second):
				}
			}
			return connect.NewError(connect.CodeOf(ctx.Err()), ctx.Err())
		}
	}
}

func keepaliveInterval(h interface{ Get(string) string }) time.Duration {
	if v := h.Get("Keepalive-Ping-Interval"); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n > 0 {
			return time.Duration(n) * time.Second
		}
	}
	return defaultKeepalive
}

// startProcess starts req as user u. The process's lifetime is bounded by
// ctx's deadline (Connect-Timeout-Ms) but not by ctx's cancellation.
func (s *Server) startProcess(ctx context.Context, u *User, req *process.StartRequest) (*proc, *subscriber, error) {
	return s.startProcessOn(ctx, u, req, true)
}

// startProcessOn is startProcess; spare says whether a spare reaper
// (spare_linux.go) may take the command.
func (s *Server) startProcessOn(ctx context.Context, u *User, req *process.StartRequest, spare bool) (*proc, *subscriber, error) {
	cfg := req.GetProcess()
	if cfg.GetCmd() == "" {
		return nil, nil, fmt.Errorf("process.cmd is empty: %w", errdefs.ErrInvalidArgument)
	}
	_, defWorkdir := s.defaults()
	cwd := u.Home
	if cfg.Cwd != nil && *cfg.Cwd != "" {
		cwd = *cfg.Cwd
	} else if defWorkdir != "" {
		cwd = defWorkdir
	}
	cwd, err := ResolvePath(cwd, u.Home)
	if err != nil {
		return nil, nil, err
	}
	var isDir bool
	_ = asUser(u, func() error {
		fi, err := os.Stat(cwd)
		isDir = err == nil && fi.IsDir()
		return nil
	})
	if !isDir {
		return nil, nil, fmt.Errorf("cwd '%s' does not exist: %w", cwd, errdefs.ErrInvalidArgument)
	}

	// Lifetime: Connect-Timeout-Ms of this request (not the request
	// itself), bounded by the command lifetime cap (lifetime.go).
	life, cancel, capped := s.processLifetime(ctx)

	cmd := exec.Command(cfg.GetCmd(), cfg.GetArgs()...)
	if cmd.Err != nil {
		cancel()
		return nil, nil, startError(cfg.GetCmd(), cmd.Err)
	}
	cmd.Dir = cwd
	cmd.Env = s.processEnv(u, cfg.GetEnvs())
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if u.UID != 0 || u.GID != 0 {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: u.Groups}
	}
	p := &proc{config: cfg, tag: req.Tag, cmd: cmd, subs: map[*subscriber]struct{}{}, done: make(chan struct{}), lifetimeCap: capped}
	s.mu.RLock()
	if s.maxCommand > 0 {
		p.capAt = time.Now().Add(s.maxCommand)
	}
	s.mu.RUnlock()
	var statusW, controlR *os.File
	var readers []io.ReadCloser
	var kinds []string
	handed := false // to a spare reaper (spare_linux.go)
	if s.reaper != "" {
		// Under the reaper (reaper_linux.go), which leads the session.
		var err error
		if p.statusF, statusW, err = os.Pipe(); err != nil {
			cancel()
			return nil, nil, err
		}
		if controlR, p.control, err = os.Pipe(); err != nil {
			p.statusF.Close()
			statusW.Close()
			cancel()
			return nil, nil, err
		}
		p.status = bufio.NewReader(p.statusF)
		if spare {
			readers, kinds, handed = s.startOnSpare(cmd, req, p, statusW, controlR)
		}
		if !handed {
			cmd.ExtraFiles = []*os.File{statusW, controlR}
			reap := []string{s.reaper, "reap"}
			if c := cmd.SysProcAttr.Credential; c != nil {
				// The reaper stays root; the command takes the user.
				reap = append(reap, "--cred", credArg(c))
				cmd.SysProcAttr.Credential = nil
			}
			cmd.Args = append(append(reap, "--", cmd.Path), cmd.Args[1:]...)
			cmd.Path = s.reaper
		}
	}
	closeReaperPipes := func(all bool) {
		if statusW != nil {
			statusW.Close()
			controlR.Close()
			if all {
				p.statusF.Close()
				p.control.Close()
			}
		}
	}

	switch {
	case handed:
	case req.Pty != nil:
		cmd.SysProcAttr.Setctty = true
		var tty *os.File
		err := s.children.Start(cmd, func() (err error) {
			tty, err = pty.StartWithAttrs(cmd, ptySize(req.Pty), cmd.SysProcAttr)
			return err
		})
		if err != nil {
			closeReaperPipes(true)
			cancel()
			return nil, nil, startError(cfg.GetCmd(), err)
		}
		p.tty = tty
		readers, kinds = []io.ReadCloser{tty}, []string{"pty"}
	default:
		files, err := s.startPiped(cmd, req.Stdin == nil || *req.Stdin, p)
		if err != nil {
			closeReaperPipes(true)
			cancel()
			return nil, nil, err
		}
		readers, kinds = files, []string{"stdout", "stderr"}
	}
	p.pid = uint32(p.cmd.Process.Pid)
	if statusW != nil {
		closeReaperPipes(false)
		p.reaperPid = p.cmd.Process.Pid
		pid, err := reaperStarted(p.status)
		if err != nil {
			// The reaper could not start the command: no process to report.
			if p.spare != nil {
				p.spare.discard()
				if errors.Is(err, io.EOF) {
					<-p.spare.gone
				}
			} else {
				_ = s.children.Wait(p.cmd)
			}
			for _, r := range readers {
				r.Close()
			}
			if p.stdin != nil {
				p.stdin.Close()
			}
			p.statusF.Close()
			p.control.Close()
			cancel()
			if handed && errors.Is(err, io.EOF) {
				// The spare died before it took the command (it reports
				// the pid as soon as the command is forked): start it
				// under a reaper of its own instead.
				s.log.Warn("spare reaper ended before starting its command; starting it anew", "reaper", p.cmd.ProcessState.String(), "cmd", cfg.GetCmd())
				return s.startProcessOn(ctx, u, req, false)
			}
			code := errdefs.ErrInvalidArgument
			switch msg := err.Error(); {
			case strings.Contains(msg, "no such file"):
				code = errdefs.ErrNotFound
			case strings.Contains(msg, "process limit is reached"):
				code = errdefs.ErrResourceExhausted
			}
			return nil, nil, fmt.Errorf("start %s: %v: %w", cfg.GetCmd(), err, code)
		}
		p.pid = uint32(pid)
	}
	sub, _ := p.subscribe()
	s.procs.add(p)
	s.log.Info("process started", "pid", p.pid, "cmd", cfg.GetCmd(), "user", u.Name, "pty", req.Pty != nil, "tag", req.GetTag())

	go s.superviseProcess(life, cancel, p, readers, kinds)
	return p, sub, nil
}

// startPiped starts cmd with stdout/stderr pipes (and a stdin pipe if
// wanted) and returns the read ends.
// ptySize is the terminal size a start request asks for, 80×24 when it
// names none.
func ptySize(t *process.PTY) *pty.Winsize {
	if size := t.GetSize(); size.GetCols() > 0 && size.GetRows() > 0 {
		return &pty.Winsize{Cols: uint16(size.GetCols()), Rows: uint16(size.GetRows())}
	}
	return &pty.Winsize{Cols: 80, Rows: 24}
}

func (s *Server) startPiped(cmd *exec.Cmd, wantStdin bool, p *proc) ([]io.ReadCloser, error) {
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, err
	}
	var inR *os.File
	if wantStdin {
		if inR, p.stdin, err = os.Pipe(); err != nil {
			outR.Close()
			outW.Close()
			errR.Close()
			errW.Close()
			return nil, err
		}
		cmd.Stdin = inR
	}
	cmd.Stdout, cmd.Stderr = outW, errW
	err = s.children.Start(cmd, cmd.Start)
	// The child has its copies; ours must go so EOF arrives when it exits.
	outW.Close()
	errW.Close()
	if inR != nil {
		inR.Close()
	}
	if err != nil {
		outR.Close()
		errR.Close()
		if p.stdin != nil {
			p.stdin.Close()
		}
		return nil, startError(cmd.Path, err)
	}
	return []io.ReadCloser{outR, errR}, nil
}

func startError(cmd string, err error) error {
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, exec.ErrNotFound) {
		return fmt.Errorf("start %s: %v: %w", cmd, err, errdefs.ErrNotFound)
	}
	if errors.Is(err, os.ErrPermission) {
		return fmt.Errorf("start %s: %w", cmd, err)
	}
	return fmt.Errorf("start %s: %w", cmd, err)
}

// superviseProcess pumps output, kills the process group when life ends,
// waits for the exit and publishes the end event.
func (s *Server) superviseProcess(life context.Context, cancel context.CancelFunc, p *proc, readers []io.ReadCloser, kinds []string) {
	var outMu sync.Mutex // one publish at a time keeps each stream in order
	var wg sync.WaitGroup
	for i, r := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, chunkSize)
			for {
				n, err := r.Read(buf)
				if n > 0 {
					data := append([]byte(nil), buf[:n]...)
					outMu.Lock()
					p.publish(dataEvent(kinds[i], data))
					outMu.Unlock()
				}
				if err != nil {
					return
				}
			}
		}()
	}

	if p.control != nil {
		s.superviseReaped(life, cancel, p, readers, &wg)
		return
	}
	defer cancel()
	waited := make(chan error, 1)
	go func() { waited <- s.children.Wait(p.cmd) }()
	var waitErr error
	killed := false
	select {
	case waitErr = <-waited:
	case <-life.Done():
		killed = true
		_ = syscall.Kill(-int(p.pid), syscall.SIGKILL)
		waitErr = <-waited
	}

	drain(p, readers, &wg)
	end := &process.ProcessEvent_EndEvent{}
	if st := p.cmd.ProcessState; st != nil {
		end.ExitCode = int32(st.ExitCode())
		end.Exited = st.Exited()
		end.Status = st.String()
	}
	if killed {
		msg := context.DeadlineExceeded.Error()
		if p.lifetimeCap > 0 {
			msg = capExceededError(p.lifetimeCap)
		}
		end.Error = &msg
	} else if waitErr != nil {
		var ee *exec.ExitError
		if !errors.As(waitErr, &ee) {
			msg := waitErr.Error()
			end.Error = &msg
		}
	}
	p.finish(end)
	s.log.Info("process ended", "pid", p.pid, "status", end.Status, "timeout", killed, "lifetimeCap", p.lifetimeCap)
	time.AfterFunc(retainExited, func() { s.procs.remove(p) })
}

// drain waits for the output readers (a little, if descendants hold the
// pipes open), closes them and the process's stdin.
func drain(p *proc, readers []io.ReadCloser, wg *sync.WaitGroup) {
	readersDone := make(chan struct{})
	go func() { wg.Wait(); close(readersDone) }()
	select {
	case <-readersDone:
	case <-time.After(drainGrace):
	}
	for _, r := range readers {
		r.Close()
	}
	<-readersDone
	p.stdinMu.Lock()
	if p.stdin != nil {
		p.stdin.Close()
		p.stdin = nil
	}
	p.stdinMu.Unlock()
}

// superviseReaped is superviseProcess for a command under a reaper: the
// command's end comes from the reaper's status pipe, and the reaper lives
// on while the command's background descendants do. When life ends while
// the command runs, or the lifetime cap passes while descendants remain,
// the reaper kills the whole tree.
func (s *Server) superviseReaped(life context.Context, cancel context.CancelFunc, p *proc, readers []io.ReadCloser, wg *sync.WaitGroup) {
	type exit struct {
		ws       syscall.WaitStatus
		ok, gone bool
	}
	exited := make(chan exit, 1)
	treeGone := make(chan struct{})
	go func() {
		// The reaper closes the pipe once the command's tree is gone, or
		// by its exit, so this ends either way.
		ws, ok, gone := reaperExit(p.status)
		exited <- exit{ws, ok, gone}
		_, _ = io.Copy(io.Discard, p.status)
		p.statusF.Close()
		close(treeGone)
	}()
	if p.spare == nil {
		go func() { _ = s.children.Wait(p.cmd) }() // the reaper of this command alone
	}
	var e exit
	// release frees the reaper once the command's tree is gone: parked
	// for the next command when commands come in succession, unless it
	// died before it reported the command's end.
	release := sync.OnceFunc(func() {
		p.control.Close()
		switch {
		case p.spare == nil:
		case p.keepSpare && e.ok:
			s.spares.put(p.spare)
		default:
			p.spare.discard()
		}
	})
	killed := false
	select {
	case e = <-exited:
	case <-life.Done():
		killed = true
		p.killTree()
		e = <-exited
	}
	if e.gone {
		// Before the end reaches the client, whose next command may
		// follow at once.
		<-treeGone
		release()
	}
	drain(p, readers, wg)
	end := &process.ProcessEvent_EndEvent{}
	if e.ok {
		end.ExitCode, end.Exited, end.Status = int32(exitCode(e.ws)), e.ws.Exited(), statusString(e.ws)
	} else {
		<-treeGone
		end.ExitCode, end.Status = -1, "signal: killed"
		msg := "the command's reaper was killed before the command ended; the command's processes were left to envd, the sandbox's init, which reaps them"
		end.Error = &msg
	}
	if killed {
		msg := context.DeadlineExceeded.Error()
		if p.lifetimeCap > 0 {
			msg = capExceededError(p.lifetimeCap)
		}
		end.Error = &msg
	}
	p.finish(end)
	s.log.Info("process ended", "pid", p.pid, "status", end.Status, "timeout", killed, "lifetimeCap", p.lifetimeCap)
	time.AfterFunc(retainExited, func() { s.procs.remove(p) })

	// Descendants the command left running (a server started with &) keep
	// running, as in E2B, but not past the command lifetime cap.
	go func() {
		defer cancel()
		var capC <-chan time.Time
		if !p.capAt.IsZero() {
			t := time.NewTimer(time.Until(p.capAt))
			defer t.Stop()
			capC = t.C
		}
		select {
		case <-treeGone:
		case <-capC:
			s.log.Info("command lifetime cap: ending what the command left running", "pid", p.pid)
			p.killTree()
			<-treeGone
		}
		release()
	}()
}

func dataEvent(kind string, b []byte) *process.ProcessEvent {
	d := &process.ProcessEvent_DataEvent{}
	switch kind {
	case "stdout":
		d.Output = &process.ProcessEvent_DataEvent_Stdout{Stdout: b}
	case "stderr":
		d.Output = &process.ProcessEvent_DataEvent_Stderr{Stderr: b}
	default:
		d.Output = &process.ProcessEvent_DataEvent_Pty{Pty: b}
	}
	return &process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: d}}
}

// processEnv is PATH, HOME, USER and LOGNAME of u, then the /init variables,
// then the request's.
func (s *Server) processEnv(u *User, extra map[string]string) []string {
	path := os.Getenv("PATH")
	if path == "" {
		path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	}
	env := map[string]string{"PATH": path, "HOME": u.Home, "USER": u.Name, "LOGNAME": u.Name}
	for k, v := range s.env() {
		env[k] = v
	}
	for k, v := range extra {
		env[k] = v
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

func (ps *processService) List(ctx context.Context, req *connect.Request[process.ListRequest]) (*connect.Response[process.ListResponse], error) {
	procs := ps.s.procs.running()
	sort.Slice(procs, func(i, j int) bool { return procs[i].pid < procs[j].pid })
	resp := &process.ListResponse{}
	for _, p := range procs {
		resp.Processes = append(resp.Processes, &process.ProcessInfo{Config: p.config, Pid: p.pid, Tag: p.tag})
	}
	return connect.NewResponse(resp), nil
}

func (ps *processService) SendInput(ctx context.Context, req *connect.Request[process.SendInputRequest]) (*connect.Response[process.SendInputResponse], error) {
	p, err := ps.s.procs.get(req.Msg.GetProcess())
	if err != nil {
		return nil, connectError(err)
	}
	if err := p.writeInput(req.Msg.GetInput()); err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&process.SendInputResponse{}), nil
}

func (ps *processService) StreamInput(ctx context.Context, stream *connect.ClientStream[process.StreamInputRequest]) (*connect.Response[process.StreamInputResponse], error) {
	var p *proc
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *process.StreamInputRequest_Start:
			found, err := ps.s.procs.get(ev.Start.GetProcess())
			if err != nil {
				return nil, connectError(err)
			}
			p = found
		case *process.StreamInputRequest_Data:
			if p == nil {
				return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("input before start event"))
			}
			if err := p.writeInput(ev.Data.GetInput()); err != nil {
				return nil, connectError(err)
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.StreamInputResponse{}), nil
}

func (ps *processService) Update(ctx context.Context, req *connect.Request[process.UpdateRequest]) (*connect.Response[process.UpdateResponse], error) {
	p, err := ps.s.procs.get(req.Msg.GetProcess())
	if err != nil {
		return nil, connectError(err)
	}
	if req.Msg.Pty != nil {
		if err := p.resize(req.Msg.Pty.GetSize()); err != nil {
			return nil, connectError(err)
		}
	}
	return connect.NewResponse(&process.UpdateResponse{}), nil
}

func (ps *processService) SendSignal(ctx context.Context, req *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	var sig syscall.Signal
	switch req.Msg.GetSignal() {
	case process.Signal_SIGNAL_SIGKILL:
		sig = syscall.SIGKILL
	case process.Signal_SIGNAL_SIGTERM:
		sig = syscall.SIGTERM
	default:
		return nil, connect.NewError(connect.CodeUnimplemented, fmt.Errorf("signal %v is not supported", req.Msg.GetSignal()))
	}
	p, err := ps.s.procs.get(req.Msg.GetProcess())
	if err != nil {
		return nil, connectError(err)
	}
	if err := p.signal(sig); err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&process.SendSignalResponse{}), nil
}

func (ps *processService) CloseStdin(ctx context.Context, req *connect.Request[process.CloseStdinRequest]) (*connect.Response[process.CloseStdinResponse], error) {
	p, err := ps.s.procs.get(req.Msg.GetProcess())
	if err != nil {
		return nil, connectError(err)
	}
	if err := p.closeStdin(); err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&process.CloseStdinResponse{}), nil
}
