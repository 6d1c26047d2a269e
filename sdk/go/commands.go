package agentbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/agentbox/agentbox/api/gen/process"
)

// keepaliveSeconds asks envd for a keepalive event after this many quiet
// seconds, so idle streams survive proxies.
const keepaliveSeconds = "50"

// Commands runs processes in a sandbox.
type Commands struct{ dp *dataPlane }

// CommandOption configures Run, Start and Connect.
type CommandOption func(*commandConfig)

type commandConfig struct {
	envs     map[string]string
	cwd      string
	user     string
	tag      string
	stdin    bool
	timeout  time.Duration
	onStdout func([]byte)
	onStderr func([]byte)
	maxOut   int
}

// WithEnvs adds environment variables for the process.
func WithEnvs(envs map[string]string) CommandOption {
	return func(c *commandConfig) { c.envs = envs }
}

// WithCwd sets the working directory; default the template's workdir.
func WithCwd(dir string) CommandOption { return func(c *commandConfig) { c.cwd = dir } }

// WithUser runs the process as this OS user; default the template's user.
func WithUser(user string) CommandOption { return func(c *commandConfig) { c.user = user } }

// WithTag names the process so it can be found by tag.
func WithTag(tag string) CommandOption { return func(c *commandConfig) { c.tag = tag } }

// WithStdin keeps the process's stdin open for SendStdin/CloseStdin.
// Without it stdin is closed at start.
func WithStdin() CommandOption { return func(c *commandConfig) { c.stdin = true } }

// WithTimeout bounds the process's life: envd kills it after d even if the
// client is gone. Zero (default) means no limit beyond ctx.
func WithTimeout(d time.Duration) CommandOption { return func(c *commandConfig) { c.timeout = d } }

// WithOutputLimit keeps at most n bytes of each of stdout and stderr in the
// result (the first n; CommandResult.Truncated tells), so a flood of output
// cannot exhaust the caller's memory. Callbacks still see everything.
// Zero (default) keeps all.
func WithOutputLimit(n int) CommandOption { return func(c *commandConfig) { c.maxOut = n } }

// WithOnStdout is called with every chunk of stdout as it arrives.
func WithOnStdout(f func([]byte)) CommandOption { return func(c *commandConfig) { c.onStdout = f } }

// WithOnStderr is called with every chunk of stderr as it arrives.
func WithOnStderr(f func([]byte)) CommandOption { return func(c *commandConfig) { c.onStderr = f } }

// CommandResult is how a process ended and what it printed.
type CommandResult struct {
	ExitCode int    // -1 when killed by a signal
	Stdout   string // everything the process wrote to stdout
	Stderr   string
	Error    string // envd's message when the process could not run or wait properly
	Status   string // e.g. "exit status 1", "signal: killed"
	// Truncated is set when WithOutputLimit cut stdout or stderr.
	Truncated bool
}

// CommandExitError is returned when a process exits non-zero; the full
// result is included.
type CommandExitError struct{ CommandResult }

func (e *CommandExitError) Error() string {
	msg := fmt.Sprintf("command exited with code %d", e.ExitCode)
	if d := e.detail(); d != "" {
		msg += ": " + d
	}
	return msg
}

// detail is the most useful hint: envd's error, else the tail of stderr.
func (e *CommandExitError) detail() string {
	if e.CommandResult.Error != "" {
		return e.CommandResult.Error
	}
	s := strings.TrimSpace(e.Stderr)
	if len(s) > 200 {
		s = "…" + s[len(s)-200:]
	}
	return s
}

// ProcessInfo describes a process envd runs.
type ProcessInfo struct {
	Pid  uint32
	Tag  string
	Cmd  string
	Args []string
	Envs map[string]string
	Cwd  string
}

// Run runs cmd with `bash -l -c` and waits for it. A non-zero exit is
// returned as *CommandExitError together with the result.
func (c *Commands) Run(ctx context.Context, cmd string, opts ...CommandOption) (*CommandResult, error) {
	h, err := c.Start(ctx, cmd, opts...)
	if err != nil {
		return nil, err
	}
	return h.Wait(ctx)
}

// Start runs cmd with `bash -l -c` in the background. ctx governs the output
// stream: cancelling it detaches from the process without killing it.
func (c *Commands) Start(ctx context.Context, cmd string, opts ...CommandOption) (*CommandHandle, error) {
	cfg := commandConfig{}
	for _, o := range opts {
		o(&cfg)
	}
	req := &process.StartRequest{
		Process: &process.ProcessConfig{
			Cmd:  "/bin/bash",
			Args: []string{"-l", "-c", cmd},
			Envs: cfg.envs,
		},
		Stdin: &cfg.stdin,
	}
	if cfg.cwd != "" {
		req.Process.Cwd = &cfg.cwd
	}
	if cfg.tag != "" {
		req.Tag = &cfg.tag
	}
	return startProcess(ctx, c.dp, req, cfg)
}

// Connect attaches to a running process by pid and streams its output.
func (c *Commands) Connect(ctx context.Context, pid uint32, opts ...CommandOption) (*CommandHandle, error) {
	cfg := commandConfig{}
	for _, o := range opts {
		o(&cfg)
	}
	sctx, cancel := streamContext(ctx, cfg.timeout)
	req := connect.NewRequest(&process.ConnectRequest{Process: pidSelector(pid)})
	req.Header().Set("Keepalive-Ping-Interval", keepaliveSeconds)
	setUser(req.Header(), cfg.user)
	stream, err := c.dp.process.Connect(sctx, req)
	if err != nil {
		cancel()
		return nil, rpcError(fmt.Sprintf("connect to process %d", pid), err)
	}
	return newHandle(c.dp, connectSource(stream), cfg, cancel)
}

// List returns the processes envd runs.
func (c *Commands) List(ctx context.Context) ([]ProcessInfo, error) {
	resp, err := c.dp.process.List(ctx, connect.NewRequest(&process.ListRequest{}))
	if err != nil {
		return nil, rpcError("list processes", err)
	}
	var out []ProcessInfo
	for _, p := range resp.Msg.GetProcesses() {
		out = append(out, ProcessInfo{
			Pid:  p.GetPid(),
			Tag:  p.GetTag(),
			Cmd:  p.GetConfig().GetCmd(),
			Args: p.GetConfig().GetArgs(),
			Envs: p.GetConfig().GetEnvs(),
			Cwd:  p.GetConfig().GetCwd(),
		})
	}
	return out, nil
}

// Kill sends SIGKILL to the process; ErrNotFound if it is gone.
func (c *Commands) Kill(ctx context.Context, pid uint32) error {
	return signalProcess(ctx, c.dp, pid, process.Signal_SIGNAL_SIGKILL)
}

// SendStdin writes data to the process's stdin (started WithStdin).
func (c *Commands) SendStdin(ctx context.Context, pid uint32, data []byte) error {
	_, err := c.dp.process.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{
		Process: pidSelector(pid),
		Input:   &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: data}},
	}))
	return rpcError(fmt.Sprintf("stdin of process %d", pid), err)
}

// CloseStdin closes the process's stdin so it reads EOF.
func (c *Commands) CloseStdin(ctx context.Context, pid uint32) error {
	_, err := c.dp.process.CloseStdin(ctx, connect.NewRequest(&process.CloseStdinRequest{Process: pidSelector(pid)}))
	return rpcError(fmt.Sprintf("close stdin of process %d", pid), err)
}

func pidSelector(pid uint32) *process.ProcessSelector {
	return &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}
}

func signalProcess(ctx context.Context, dp *dataPlane, pid uint32, sig process.Signal) error {
	_, err := dp.process.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{
		Process: pidSelector(pid), Signal: sig,
	}))
	return rpcError(fmt.Sprintf("signal process %d", pid), err)
}

// streamContext gives a stream its own cancel, and a deadline when timeout
// is set: connect-go sends it as Connect-Timeout-Ms, which envd takes as the
// process's lifetime.
func streamContext(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	if timeout > 0 {
		return context.WithTimeout(ctx, timeout)
	}
	return context.WithCancel(ctx)
}

// eventSource is a Start or Connect stream; their message types differ but
// both carry a ProcessEvent.
type eventSource struct {
	Receive func() bool
	Err     func() error
	Close   func() error
	Event   func() *process.ProcessEvent
}

func startSource(s *connect.ServerStreamForClient[process.StartResponse]) eventSource {
	return eventSource{s.Receive, s.Err, s.Close, func() *process.ProcessEvent { return s.Msg().GetEvent() }}
}

func connectSource(s *connect.ServerStreamForClient[process.ConnectResponse]) eventSource {
	return eventSource{s.Receive, s.Err, s.Close, func() *process.ProcessEvent { return s.Msg().GetEvent() }}
}

func startProcess(ctx context.Context, dp *dataPlane, req *process.StartRequest, cfg commandConfig) (*CommandHandle, error) {
	sctx, cancel := streamContext(ctx, cfg.timeout)
	r := connect.NewRequest(req)
	r.Header().Set("Keepalive-Ping-Interval", keepaliveSeconds)
	setUser(r.Header(), cfg.user)
	stream, err := dp.process.Start(sctx, r)
	if err != nil {
		cancel()
		return nil, rpcError("start process", err)
	}
	return newHandle(dp, startSource(stream), cfg, cancel)
}

// CommandHandle is a process started in the background (or re-attached).
type CommandHandle struct {
	Pid uint32

	dp     *dataPlane
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	stdout bytes.Buffer
	stderr bytes.Buffer
	// truncated: output was dropped past WithOutputLimit.
	truncated bool
	result    *CommandResult
	err       error
}

func newHandle(dp *dataPlane, src eventSource, cfg commandConfig, cancel context.CancelFunc) (*CommandHandle, error) {
	// The first event must be start{pid}.
	for {
		if !src.Receive() {
			err := src.Err()
			src.Close()
			cancel()
			if err == nil {
				err = errors.New("stream ended before the process started")
			}
			return nil, rpcError("start process", err)
		}
		if st := src.Event().GetStart(); st != nil {
			h := &CommandHandle{Pid: st.GetPid(), dp: dp, cancel: cancel, done: make(chan struct{})}
			go h.read(src, cfg)
			return h, nil
		}
	}
}

func (h *CommandHandle) read(src eventSource, cfg commandConfig) {
	defer close(h.done)
	defer h.cancel()
	defer src.Close()
	for src.Receive() {
		ev := src.Event()
		switch {
		case ev.GetData() != nil:
			d := ev.GetData()
			if b := d.GetStdout(); b != nil {
				h.mu.Lock()
				h.keep(&h.stdout, b, cfg.maxOut)
				h.mu.Unlock()
				if cfg.onStdout != nil {
					cfg.onStdout(b)
				}
			}
			if b := d.GetStderr(); b != nil {
				h.mu.Lock()
				h.keep(&h.stderr, b, cfg.maxOut)
				h.mu.Unlock()
				if cfg.onStderr != nil {
					cfg.onStderr(b)
				}
			}
			if b := d.GetPty(); b != nil && cfg.onStdout != nil {
				cfg.onStdout(b)
			}
		case ev.GetEnd() != nil:
			e := ev.GetEnd()
			h.mu.Lock()
			h.result = &CommandResult{
				ExitCode:  int(e.GetExitCode()),
				Stdout:    h.stdout.String(),
				Stderr:    h.stderr.String(),
				Error:     e.GetError(),
				Status:    e.GetStatus(),
				Truncated: h.truncated,
			}
			h.mu.Unlock()
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.result == nil {
		err := src.Err()
		if err == nil {
			err = errors.New("stream ended without an end event")
		}
		h.err = rpcError(fmt.Sprintf("process %d", h.Pid), err)
	}
}

// keep appends b to buf up to limit bytes (0: no limit). Called with h.mu.
func (h *CommandHandle) keep(buf *bytes.Buffer, b []byte, limit int) {
	if limit > 0 && buf.Len()+len(b) > limit {
		b = b[:max(limit-buf.Len(), 0)]
		h.truncated = true
	}
	buf.Write(b)
}

// Wait blocks until the process ends (or ctx is done) and returns its
// result; a non-zero exit is a *CommandExitError.
func (h *CommandHandle) Wait(ctx context.Context) (*CommandResult, error) {
	select {
	case <-h.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.err != nil {
		return nil, h.err
	}
	r := *h.result
	if r.ExitCode != 0 {
		return &r, &CommandExitError{r}
	}
	return &r, nil
}

// Done is closed when the output stream has ended.
func (h *CommandHandle) Done() <-chan struct{} { return h.done }

// Stdout is the stdout received so far.
func (h *CommandHandle) Stdout() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.stdout.String()
}

// Stderr is the stderr received so far.
func (h *CommandHandle) Stderr() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.stderr.String()
}

// Kill sends SIGKILL to the process.
func (h *CommandHandle) Kill(ctx context.Context) error {
	return signalProcess(ctx, h.dp, h.Pid, process.Signal_SIGNAL_SIGKILL)
}

// SendStdin writes to the process's stdin (started WithStdin).
func (h *CommandHandle) SendStdin(ctx context.Context, data []byte) error {
	return (&Commands{dp: h.dp}).SendStdin(ctx, h.Pid, data)
}

// CloseStdin closes the process's stdin.
func (h *CommandHandle) CloseStdin(ctx context.Context) error {
	return (&Commands{dp: h.dp}).CloseStdin(ctx, h.Pid)
}

// Disconnect stops receiving output; the process keeps running.
func (h *CommandHandle) Disconnect() { h.cancel() }
