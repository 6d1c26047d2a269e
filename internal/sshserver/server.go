// Package sshserver serves the SSH protocol on one connection and runs its
// sessions in a sandbox through the sandbox's data plane, for
// `agentbox ssh`. It runs in the client's process, on the end of a pipe
// (OpenSSH's ProxyCommand, or the CLI's own SSH client): nothing listens,
// on the host or in the sandbox. Every shell and command of a session is a
// process start over envd's API through the gateway, with the sandbox's
// access token, so it gets the same admission, guess limiter and audit
// record as an SDK's terminal; the SSH layer adds no credential of its own.
package sshserver

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"

	"golang.org/x/crypto/ssh"
)

// Spec is one process a session asks for.
type Spec struct {
	Cmd        string            // run with `bash -l -c`; "" is an interactive login shell
	User       string            // OS user in the sandbox; "" is the template's
	Envs       map[string]string // from "env" requests (and TERM from the pty)
	PTY        bool
	Cols, Rows uint32
}

// Process is a running process of a session.
type Process interface {
	Input(ctx context.Context, b []byte) error
	CloseInput(ctx context.Context) error
	Resize(ctx context.Context, cols, rows uint32) error
	// Wait returns the exit code, or the signal name ("KILL") that ended it.
	Wait(ctx context.Context) (code int, signal string, err error)
	Kill(ctx context.Context) error
}

// Runner starts processes in one sandbox; stdout and stderr receive the
// output as it arrives (a PTY has only stdout).
type Runner interface {
	Start(ctx context.Context, s Spec, stdout, stderr io.Writer) (Process, error)
}

// Serve speaks SSH (as the server) on conn until the client disconnects or
// ctx ends, running each session's processes through r. No client
// authentication is asked: whoever holds this end of the pipe has already
// been authenticated by the server for the sandbox (the API key and the
// sandbox's access token), and a second secret would only be weaker. The
// host key is made for this connection alone: it authenticates nothing
// beyond the pipe, which the HTTPS connection to the server already does.
func Serve(ctx context.Context, conn net.Conn, r Runner, log *slog.Logger) error {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return fmt.Errorf("ssh host key: %w", err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		return fmt.Errorf("ssh host key: %w", err)
	}
	cfg := &ssh.ServerConfig{NoClientAuth: true, ServerVersion: "SSH-2.0-agentbox"}
	cfg.AddHostKey(signer)
	sc, chans, reqs, err := ssh.NewServerConn(conn, cfg)
	if err != nil {
		return fmt.Errorf("ssh handshake: %w", err)
	}
	defer sc.Close()
	stop := context.AfterFunc(ctx, func() { sc.Close() })
	defer stop()
	go ssh.DiscardRequests(reqs)
	var wg sync.WaitGroup
	defer wg.Wait()
	for nc := range chans {
		if nc.ChannelType() != "session" {
			_ = nc.Reject(ssh.UnknownChannelType, "only sessions are served (no port forwarding: use agentbox port-forward)")
			continue
		}
		ch, creqs, err := nc.Accept()
		if err != nil {
			log.Debug("ssh: accept channel", "err", err)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := &session{ch: ch, r: r, log: log, spec: Spec{User: sc.User(), Envs: map[string]string{}}}
			s.serve(ctx, creqs)
		}()
	}
	return nil
}

// SFTPCommand runs the sandbox's sftp-server for the sftp subsystem, from
// where Debian, Fedora and Alpine put it.
const SFTPCommand = `for p in /usr/lib/openssh/sftp-server /usr/libexec/openssh/sftp-server /usr/lib/ssh/sftp-server /usr/libexec/sftp-server; do ` +
	`[ -x "$p" ] && exec "$p"; done; ` +
	`echo "agentbox ssh: no sftp-server in this sandbox; add the openssh-sftp-server package to its template" >&2; exit 127`

// session is one SSH session channel: requests set it up, then "shell" or
// "exec" starts its one process.
type session struct {
	ch   ssh.Channel
	r    Runner
	log  *slog.Logger
	spec Spec

	mu   sync.Mutex
	proc Process // set once started
}

func (s *session) serve(ctx context.Context, reqs <-chan *ssh.Request) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer s.ch.Close()
	done := make(chan struct{})
	started := false
	for {
		select {
		case req, ok := <-reqs:
			if !ok {
				// The client closed the channel: the process goes with it,
				// as sshd hangs up a session's processes.
				if p := s.started(); p != nil {
					_ = p.Kill(context.WithoutCancel(ctx))
				}
				return
			}
			ok = s.handle(ctx, req, &started, done)
			if req.WantReply {
				_ = req.Reply(ok, nil)
			}
		case <-done:
			return
		}
	}
}

func (s *session) started() Process {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc
}

// handle answers one channel request; false refuses it.
func (s *session) handle(ctx context.Context, req *ssh.Request, started *bool, done chan struct{}) bool {
	switch req.Type {
	case "pty-req":
		var p struct {
			Term          string
			Cols, Rows    uint32
			Width, Height uint32
			Modes         string
		}
		if *started || ssh.Unmarshal(req.Payload, &p) != nil {
			return false
		}
		s.spec.PTY, s.spec.Cols, s.spec.Rows = true, p.Cols, p.Rows
		if p.Term != "" {
			s.spec.Envs["TERM"] = p.Term
		}
		return true
	case "env":
		var e struct{ Name, Value string }
		if *started || ssh.Unmarshal(req.Payload, &e) != nil || e.Name == "" {
			return false
		}
		s.spec.Envs[e.Name] = e.Value
		return true
	case "shell", "exec":
		if *started {
			return false
		}
		if req.Type == "exec" {
			var c struct{ Command string }
			if ssh.Unmarshal(req.Payload, &c) != nil {
				return false
			}
			s.spec.Cmd = c.Command
		}
		*started = true
		if err := s.start(ctx, done); err != nil {
			fmt.Fprintf(s.ch.Stderr(), "agentbox: %v\r\n", err)
			s.exit(255, "")
			close(done)
		}
		return true
	case "window-change":
		var w struct{ Cols, Rows, Width, Height uint32 }
		p := s.started()
		if p == nil || ssh.Unmarshal(req.Payload, &w) != nil {
			return false
		}
		return p.Resize(ctx, w.Cols, w.Rows) == nil
	case "signal":
		var sig struct{ Name string }
		p := s.started()
		if p == nil || ssh.Unmarshal(req.Payload, &sig) != nil {
			return false
		}
		// envd's API delivers SIGKILL; the signals that mean "stop" map to it.
		switch sig.Name {
		case "KILL", "TERM", "INT", "HUP", "QUIT":
			return p.Kill(ctx) == nil
		}
		return false
	case "subsystem":
		// sftp (and OpenSSH's scp, which speaks it) is the sandbox's own
		// sftp-server, run like any command, as sshd does.
		var sub struct{ Name string }
		if *started || ssh.Unmarshal(req.Payload, &sub) != nil || sub.Name != "sftp" {
			return false
		}
		s.spec.Cmd, s.spec.PTY = SFTPCommand, false
		*started = true
		if err := s.start(ctx, done); err != nil {
			fmt.Fprintf(s.ch.Stderr(), "agentbox: %v\r\n", err)
			s.exit(255, "")
			close(done)
		}
		return true
	}
	return false
}

// start runs the session's process and pumps its input; done is closed
// once it has exited and its status was sent.
func (s *session) start(ctx context.Context, done chan struct{}) error {
	stderr := io.Writer(s.ch.Stderr())
	if s.spec.PTY {
		stderr = s.ch
	}
	p, err := s.r.Start(ctx, s.spec, s.ch, stderr)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.proc = p
	s.mu.Unlock()
	go s.pumpInput(ctx, p)
	go func() {
		defer close(done)
		code, sig, err := p.Wait(ctx)
		if err != nil && ctx.Err() == nil {
			fmt.Fprintf(s.ch.Stderr(), "agentbox: %v\r\n", err)
			code = 255
		}
		s.exit(code, sig)
	}()
	return nil
}

// pumpInput sends the channel's data to the process in order; EOF closes
// the process's stdin (a terminal has none to close: EOF is ^D's job).
func (s *session) pumpInput(ctx context.Context, p Process) {
	buf := make([]byte, 32<<10)
	for {
		n, err := s.ch.Read(buf)
		if n > 0 {
			if ierr := p.Input(ctx, buf[:n]); ierr != nil {
				return
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) && !s.spec.PTY {
				_ = p.CloseInput(ctx)
			}
			return
		}
	}
}

// exit sends how the process ended, as sshd does, and ends the output.
func (s *session) exit(code int, sig string) {
	if sig != "" {
		_, _ = s.ch.SendRequest("exit-signal", false, ssh.Marshal(struct {
			Signal     string
			CoreDumped bool
			Message    string
			Lang       string
		}{Signal: sig}))
	} else {
		_, _ = s.ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{uint32(code)}))
	}
	_ = s.ch.CloseWrite()
}
