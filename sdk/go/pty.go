package agentbox

import (
	"context"
	"fmt"
	"time"

	"connectrpc.com/connect"

	"github.com/agentbox/agentbox/api/gen/process"
)

// PTY runs interactive terminals in a sandbox.
type PTY struct{ dp *dataPlane }

// PTYOptions describe a new terminal running an interactive login bash.
type PTYOptions struct {
	Cols, Rows uint16            // terminal size; default 80x24
	OnData     func([]byte)      // terminal output as it arrives
	Envs       map[string]string // added to TERM=xterm-256color, LANG/LC_ALL=C.UTF-8
	Cwd        string            // default the template's workdir
	User       string            // default the template's user
	// Cmd, when set, runs with `bash -l -c` on the terminal instead of an
	// interactive login bash (as `ssh -t host cmd` does).
	Cmd string
	// Timeout bounds the terminal's life; zero means no limit beyond ctx.
	Timeout time.Duration
}

// PTYHandle is a running terminal.
type PTYHandle struct {
	*CommandHandle
}

// Create starts `bash -i -l` (or opts.Cmd) on a new terminal. ctx governs the output
// stream for the terminal's whole life.
func (p *PTY) Create(ctx context.Context, opts PTYOptions) (*PTYHandle, error) {
	if opts.Cols == 0 {
		opts.Cols = 80
	}
	if opts.Rows == 0 {
		opts.Rows = 24
	}
	envs := map[string]string{"TERM": "xterm-256color", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
	for k, v := range opts.Envs {
		envs[k] = v
	}
	stdin := true
	args := []string{"-i", "-l"}
	if opts.Cmd != "" {
		args = []string{"-l", "-c", opts.Cmd}
	}
	req := &process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: args, Envs: envs},
		Pty:     &process.PTY{Size: &process.PTY_Size{Cols: uint32(opts.Cols), Rows: uint32(opts.Rows)}},
		Stdin:   &stdin,
	}
	if opts.Cwd != "" {
		req.Process.Cwd = &opts.Cwd
	}
	h, err := startProcess(ctx, p.dp, req, commandConfig{user: opts.User, timeout: opts.Timeout, onStdout: opts.OnData})
	if err != nil {
		return nil, err
	}
	return &PTYHandle{h}, nil
}

// Connect re-attaches to a terminal by pid.
func (p *PTY) Connect(ctx context.Context, pid uint32, onData func([]byte)) (*PTYHandle, error) {
	h, err := (&Commands{dp: p.dp}).Connect(ctx, pid, WithOnStdout(onData))
	if err != nil {
		return nil, err
	}
	return &PTYHandle{h}, nil
}

// SendInput writes keystrokes to the terminal.
func (h *PTYHandle) SendInput(ctx context.Context, data []byte) error {
	_, err := h.dp.process.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{
		Process: pidSelector(h.Pid),
		Input:   &process.ProcessInput{Input: &process.ProcessInput_Pty{Pty: data}},
	}))
	return rpcError(fmt.Sprintf("input to terminal %d", h.Pid), err)
}

// Resize changes the terminal size.
func (h *PTYHandle) Resize(ctx context.Context, cols, rows uint16) error {
	_, err := h.dp.process.Update(ctx, connect.NewRequest(&process.UpdateRequest{
		Process: pidSelector(h.Pid),
		Pty:     &process.PTY{Size: &process.PTY_Size{Cols: uint32(cols), Rows: uint32(rows)}},
	}))
	return rpcError(fmt.Sprintf("resize terminal %d", h.Pid), err)
}
