package sshserver

import (
	"context"
	"errors"
	"io"
	"strings"

	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// SandboxRunner runs a session's processes in sbx through its data plane.
type SandboxRunner struct{ Sandbox *agentbox.Sandbox }

// Start starts s: on a terminal through the PTY API, otherwise as a
// command with its stdin open.
func (r SandboxRunner) Start(ctx context.Context, s Spec, stdout, stderr io.Writer) (Process, error) {
	write := func(w io.Writer) func([]byte) { return func(b []byte) { _, _ = w.Write(b) } }
	if s.PTY {
		h, err := r.Sandbox.PTY.Create(ctx, agentbox.PTYOptions{
			Cols: uint16(min(s.Cols, 1<<15)), Rows: uint16(min(s.Rows, 1<<15)),
			OnData: write(stdout), Envs: s.Envs, User: s.User, Cmd: s.Cmd,
		})
		if err != nil {
			return nil, err
		}
		return ptyProcess{h}, nil
	}
	cmd := s.Cmd
	if cmd == "" {
		cmd = "exec /bin/bash -l"
	}
	opts := []agentbox.CommandOption{
		agentbox.WithStdin(), agentbox.WithOnStdout(write(stdout)), agentbox.WithOnStderr(write(stderr)),
		// The output goes to the channel; the handle keeps next to none.
		agentbox.WithOutputLimit(1),
	}
	if len(s.Envs) > 0 {
		opts = append(opts, agentbox.WithEnvs(s.Envs))
	}
	if s.User != "" {
		opts = append(opts, agentbox.WithUser(s.User))
	}
	h, err := r.Sandbox.Commands.Start(ctx, cmd, opts...)
	if err != nil {
		return nil, err
	}
	return cmdProcess{h}, nil
}

type cmdProcess struct{ h *agentbox.CommandHandle }

func (p cmdProcess) Input(ctx context.Context, b []byte) error { return p.h.SendStdin(ctx, b) }
func (p cmdProcess) CloseInput(ctx context.Context) error      { return p.h.CloseStdin(ctx) }
func (p cmdProcess) Resize(context.Context, uint32, uint32) error {
	return errors.New("no terminal to resize")
}
func (p cmdProcess) Kill(ctx context.Context) error { return p.h.Kill(ctx) }
func (p cmdProcess) Wait(ctx context.Context) (int, string, error) {
	return waitResult(p.h.Wait(ctx))
}

type ptyProcess struct{ h *agentbox.PTYHandle }

func (p ptyProcess) Input(ctx context.Context, b []byte) error { return p.h.SendInput(ctx, b) }
func (p ptyProcess) CloseInput(context.Context) error          { return nil }
func (p ptyProcess) Resize(ctx context.Context, cols, rows uint32) error {
	return p.h.Resize(ctx, uint16(min(cols, 1<<15)), uint16(min(rows, 1<<15)))
}
func (p ptyProcess) Kill(ctx context.Context) error { return p.h.Kill(ctx) }
func (p ptyProcess) Wait(ctx context.Context) (int, string, error) {
	return waitResult(p.h.Wait(ctx))
}

// waitResult turns a command's result into an exit code or a signal name.
func waitResult(res *agentbox.CommandResult, err error) (int, string, error) {
	var exit *agentbox.CommandExitError
	if errors.As(err, &exit) {
		res, err = &exit.CommandResult, nil
	}
	if err != nil {
		return 0, "", err
	}
	if res.ExitCode < 0 {
		return 0, signalName(res.Status), nil
	}
	return res.ExitCode, "", nil
}

// signalName maps envd's status ("signal: killed", Go's wording) to the
// signal name SSH's exit-signal carries.
func signalName(status string) string {
	names := map[string]string{"killed": "KILL", "terminated": "TERM", "interrupt": "INT", "hangup": "HUP",
		"quit": "QUIT", "aborted": "ABRT", "segmentation fault": "SEGV", "broken pipe": "PIPE", "alarm clock": "ALRM",
		"user defined signal 1": "USR1", "user defined signal 2": "USR2"}
	s, _ := strings.CutPrefix(status, "signal: ")
	s = strings.TrimSuffix(s, " (core dumped)")
	if n, ok := names[s]; ok {
		return n
	}
	return "KILL"
}
