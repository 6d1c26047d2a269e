package interpreter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// jupyterKernel is a Jupyter kernel process (Debian's ipykernel for
// Python, IRkernel for R) driven over the Jupyter protocol.
type jupyterKernel struct {
	p      *proc
	client *jupyterClient
	dir    string // holds the connection file
	name   string // for errors: "ipykernel", "IRkernel"
	// interruptFlag, if set, is a file Interrupt creates before its
	// signal and the next execution removes: kernels whose blocking calls
	// swallow SIGINT (R's system()) check it once such a call returns.
	interruptFlag string
}

type pythonConfig struct {
	Python     string // interpreter with ipykernel, e.g. /usr/bin/python3
	IPythonDir string // profile with our config and start-up files
	RuntimeDir string // parent of per-kernel connection-file dirs
	Cwd        string
	Log        io.Writer // the kernel process's own stdout/stderr (never user output)
}

// startPython launches a kernel and returns once it answered a
// kernel_info_request, i.e. is ready to execute.
func startPython(ctx context.Context, cfg pythonConfig) (*jupyterKernel, error) {
	dir, err := os.MkdirTemp(cfg.RuntimeDir, "py-")
	if err != nil {
		return nil, fmt.Errorf("python kernel: %w", err)
	}
	// The connection file must not exist yet: ipykernel then binds random
	// free ports itself and writes them (with a fresh key) to the file,
	// which is free of the race of picking ports for it.
	connFile := filepath.Join(dir, "kernel.json")
	cmd := exec.Command(cfg.Python, "-m", "ipykernel_launcher", "-f", connFile)
	cmd.Dir = cfg.Cwd
	cmd.Env = kernelEnv(map[string]string{
		"IPYTHONDIR": cfg.IPythonDir,
		// ipykernel's own default, made explicit so a sandbox-wide
		// MPLBACKEND (e.g. Agg) cannot turn inline figures off.
		"MPLBACKEND":                     "module://matplotlib_inline.backend_inline",
		"PYDEVD_DISABLE_FILE_VALIDATION": "1",
		"JPY_SESSION_NAME":               "",
	})
	k, err := startJupyter(ctx, cmd, "ipykernel", dir, connFile, cfg.Log)
	if err != nil {
		return nil, fmt.Errorf("python kernel: %w", err)
	}
	return k, nil
}

// startJupyter starts cmd, the Jupyter kernel name, with its output to log,
// and connects to it through connFile once it answers. dir, which holds the
// connection file, goes with the kernel, or at once if it does not start.
func startJupyter(ctx context.Context, cmd *exec.Cmd, name, dir, connFile string, log io.Writer) (*jupyterKernel, error) {
	cmd.Stdout, cmd.Stderr = log, log
	p, err := startProc(cmd)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	k := &jupyterKernel{p: p, dir: dir, name: name}
	if err := k.connect(ctx, connFile); err != nil {
		k.Close()
		return nil, err
	}
	return k, nil
}

func (k *jupyterKernel) connect(ctx context.Context, connFile string) error {
	var ci connectionInfo
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		// The file is written non-atomically: retry until it parses.
		if b, err := os.ReadFile(connFile); err == nil && json.Unmarshal(b, &ci) == nil && ci.ShellPort != 0 {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no connection file after start: %w", ctx.Err())
		case <-k.p.exited:
			return fmt.Errorf("%s exited at start (%s); is it installed? (see the interpreter log)", k.name, k.p.reason)
		case <-tick.C:
		}
	}
	if ci.SignatureScheme != "" && ci.SignatureScheme != "hmac-sha256" {
		return fmt.Errorf("unsupported signature scheme %q", ci.SignatureScheme)
	}
	if err := k.waitListening(ctx, ci); err != nil {
		return err
	}
	c, err := dialJupyter(ctx, ci)
	if err != nil {
		return err
	}
	k.client = c
	// Ready = kernel_info_reply plus an iopub status for it: the latter
	// proves the iopub subscription is live, so no output of the first
	// execution can be lost (ZeroMQ's slow-joiner problem).
	for attempt := 0; ; attempt++ {
		got := make(chan string, 8)
		var reply, status bool
		_, cancel, err := c.request("shell", "kernel_info_request", map[string]any{}, func(channel string, m *message) {
			if (channel == "shell" && m.Header.MsgType == "kernel_info_reply") || (channel == "iopub" && m.Header.MsgType == "status") {
				select {
				case got <- channel:
				default:
				}
			}
		})
		if err != nil {
			return err
		}
		timeout := time.NewTimer(time.Second)
	wait:
		for !(reply && status) {
			select {
			case ch := <-got:
				if ch == "shell" {
					reply = true
				} else {
					status = true
				}
			case <-timeout.C:
				break wait
			case <-k.p.exited:
				cancel()
				return fmt.Errorf("%s exited at start (%s)", k.name, k.p.reason)
			case <-ctx.Done():
				cancel()
				return fmt.Errorf("kernel did not answer kernel_info: %w", ctx.Err())
			}
		}
		timeout.Stop()
		cancel()
		if reply && status {
			return nil
		}
	}
}

// waitListening waits until the kernel listens on its ports. IRkernel
// binds the ports its connection file names only once R has loaded it,
// which on a busy host takes longer than the socket library's own dial
// retries last; a plain TCP connect (dropped at once) costs the kernel
// nothing.
func (k *jupyterKernel) waitListening(ctx context.Context, ci connectionInfo) error {
	if ci.Transport != "tcp" {
		return nil
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for _, port := range []int{ci.IOPubPort, ci.ShellPort, ci.ControlPort} {
		addr := net.JoinHostPort(ci.IP, strconv.Itoa(port))
		for {
			var d net.Dialer
			dctx, cancel := context.WithTimeout(ctx, time.Second)
			c, err := d.DialContext(dctx, "tcp", addr)
			cancel()
			if err == nil {
				c.Close()
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("%s did not listen on %s: %w", k.name, addr, ctx.Err())
			case <-k.p.exited:
				return fmt.Errorf("%s exited at start (%s); is it installed? (see the interpreter log)", k.name, k.p.reason)
			case <-tick.C:
			}
		}
	}
	return nil
}

type executeContent struct {
	ExecutionCount int                        `json:"execution_count"`
	Name           string                     `json:"name"`
	Text           string                     `json:"text"`
	Data           map[string]json.RawMessage `json:"data"`
	Ename          string                     `json:"ename"`
	Evalue         string                     `json:"evalue"`
	Traceback      []string                   `json:"traceback"`
	Status         string                     `json:"status"`
	ExecutionState string                     `json:"execution_state"`
}

func (k *jupyterKernel) Execute(ctx context.Context, code string, silent bool, sink Sink) error {
	if k.interruptFlag != "" {
		// An earlier cell's interrupt must not stop this one.
		if err := os.Remove(k.interruptFlag); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%s: clearing the interrupt flag: %w", k.name, err)
		}
	}
	type routed struct {
		channel string
		m       *message
	}
	msgs := make(chan routed, 64)
	finished := make(chan struct{})
	defer close(finished)
	_, cancel, err := k.client.request("shell", "execute_request", map[string]any{
		"code": code, "silent": silent, "store_history": !silent,
		"user_expressions": map[string]any{}, "allow_stdin": false,
		// stop_on_error makes ipykernel abort requests that arrive in the
		// moment after an error, e.g. the next cell right after an
		// interrupted one. Executions here never queue, so it buys nothing.
		"stop_on_error": false,
	}, func(channel string, m *message) {
		if channel == "control" {
			return
		}
		select {
		case msgs <- routed{channel, m}: // blocks the reader when the client is slow: backpressure
		case <-finished:
		}
	})
	if err != nil {
		return err
	}
	defer cancel()

	done := make(chan struct{})
	var gotReply, gotIdle, gotError bool
	result := make(chan error, 1)
	go func() { result <- waitDone(ctx, k, done) }()
	for {
		select {
		case err := <-result:
			if err != nil {
				return err
			}
			// waitDone saw done closed: drain what is queued.
			for {
				select {
				case m := <-msgs:
					k.handle(m.channel, m.m, silent, sink, &gotReply, &gotIdle, &gotError)
				default:
					return nil
				}
			}
		case m := <-msgs:
			k.handle(m.channel, m.m, silent, sink, &gotReply, &gotIdle, &gotError)
			if gotReply && gotIdle {
				select {
				case <-done:
				default:
					close(done)
				}
			}
		}
	}
}

func (k *jupyterKernel) handle(channel string, m *message, silent bool, sink Sink, gotReply, gotIdle, gotError *bool) {
	var c executeContent
	if err := json.Unmarshal(m.Content, &c); err != nil {
		sink.Stderr(fmt.Sprintf("[agentbox: undecodable %s message from the kernel: %v]\n", m.Header.MsgType, err))
		return
	}
	if channel == "shell" {
		if m.Header.MsgType != "execute_reply" {
			return
		}
		*gotReply = true
		switch c.Status {
		case "error":
			if !*gotError {
				*gotError = true
				sink.Error(c.Ename, c.Evalue, strings.Join(c.Traceback, "\n"))
			}
		case "aborted", "abort":
			sink.Error("ExecutionAborted", "Execution was aborted", "")
		}
		return
	}
	switch m.Header.MsgType {
	case "execute_input":
		if !silent {
			sink.ExecutionCount(c.ExecutionCount)
		}
	case "stream":
		if c.Name == "stderr" {
			sink.Stderr(c.Text)
		} else {
			sink.Stdout(c.Text)
		}
	case "execute_result":
		sink.Result(c.Data, true)
	case "display_data", "update_display_data":
		sink.Result(c.Data, false)
	case "error":
		if !*gotError {
			*gotError = true
			sink.Error(c.Ename, c.Evalue, strings.Join(c.Traceback, "\n"))
		}
	case "status":
		if c.ExecutionState == "idle" {
			*gotIdle = true
		}
	}
}

// Interrupt sends SIGINT to the kernel's process group: ipykernel turns it
// into KeyboardInterrupt while it executes (and ignores it while idle),
// IRkernel into an R interrupt, and programs the code started stop too.
func (k *jupyterKernel) Interrupt() error {
	if k.interruptFlag != "" {
		if err := os.WriteFile(k.interruptFlag, nil, 0o600); err != nil {
			return fmt.Errorf("%s: setting the interrupt flag: %w", k.name, err)
		}
	}
	return k.p.signalGroup(syscall.SIGINT)
}

func (k *jupyterKernel) Exited() <-chan struct{} { return k.p.exited }
func (k *jupyterKernel) ExitReason() string      { return k.p.reason }
func (k *jupyterKernel) PID() int                { return k.p.pid() }

func (k *jupyterKernel) Close() {
	k.p.kill()
	if k.client != nil {
		k.client.Close()
	}
	_ = os.RemoveAll(k.dir) // a leftover connection file is harmless
}
