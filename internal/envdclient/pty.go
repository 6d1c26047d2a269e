package envdclient

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"

	"github.com/agentbox/agentbox/api/gen/process"
)

// PTY is an interactive login shell on a pseudo-terminal in the sandbox.
type PTY struct {
	c      *Client
	pid    uint32
	stream *connect.ServerStreamForClient[process.StartResponse]
}

// StartPTY starts a login bash on a cols×rows terminal as user ("" = envd's
// default user). ctx bounds the shell's whole life.
func (c *Client) StartPTY(ctx context.Context, user string, cols, rows uint16) (*PTY, error) {
	envs := map[string]string{"TERM": "xterm-256color", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
	req := connect.NewRequest(&process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-i", "-l"}, Envs: envs},
		Pty:     &process.PTY{Size: &process.PTY_Size{Cols: uint32(cols), Rows: uint32(rows)}},
	})
	c.authorize(req.Header(), user)
	stream, err := c.proc.Start(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("start terminal: %w", err)
	}
	for stream.Receive() {
		if st := stream.Msg().GetEvent().GetStart(); st != nil {
			return &PTY{c: c, pid: st.GetPid(), stream: stream}, nil
		}
	}
	err = stream.Err()
	stream.Close()
	if err == nil {
		err = ErrNoExit
	}
	return nil, fmt.Errorf("start terminal: %w", err)
}

// ErrExited is returned by Read once the shell has ended.
var ErrExited = errors.New("terminal exited")

// Read returns the terminal's next output; ErrExited when the shell ended.
func (p *PTY) Read() ([]byte, error) {
	for p.stream.Receive() {
		ev := p.stream.Msg().GetEvent()
		if b := ev.GetData().GetPty(); len(b) > 0 {
			return b, nil
		}
		if ev.GetEnd() != nil {
			return nil, ErrExited
		}
	}
	if err := p.stream.Err(); err != nil {
		return nil, err
	}
	return nil, ErrExited
}

// Write sends keystrokes to the terminal.
func (p *PTY) Write(ctx context.Context, b []byte) error {
	req := connect.NewRequest(&process.SendInputRequest{Process: p.selector(), Input: &process.ProcessInput{Input: &process.ProcessInput_Pty{Pty: b}}})
	p.c.authorize(req.Header(), "")
	_, err := p.c.proc.SendInput(ctx, req)
	return err
}

// Resize changes the terminal's size.
func (p *PTY) Resize(ctx context.Context, cols, rows uint16) error {
	req := connect.NewRequest(&process.UpdateRequest{Process: p.selector(), Pty: &process.PTY{Size: &process.PTY_Size{Cols: uint32(cols), Rows: uint32(rows)}}})
	p.c.authorize(req.Header(), "")
	_, err := p.c.proc.Update(ctx, req)
	return err
}

// Close kills the shell (a terminal nobody watches must not outlive its
// viewer) and ends the stream.
func (p *PTY) Close(ctx context.Context) error {
	req := connect.NewRequest(&process.SendSignalRequest{Process: p.selector(), Signal: process.Signal_SIGNAL_SIGKILL})
	p.c.authorize(req.Header(), "")
	_, err := p.c.proc.SendSignal(ctx, req)
	p.stream.Close()
	return err
}

func (p *PTY) selector() *process.ProcessSelector {
	return &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: p.pid}}
}
