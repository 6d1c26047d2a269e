package sshserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"golang.org/x/crypto/ssh"
)

// echoRunner's process copies its stdin to stdout, prints its spec to
// stderr, and exits with the number the command names ("exit 3"), or the
// signal ("signal TERM").
type echoRunner struct {
	mu    sync.Mutex
	specs []Spec
}

func (r *echoRunner) Start(_ context.Context, s Spec, stdout, stderr io.Writer) (Process, error) {
	if s.Cmd == "fail" {
		return nil, errors.New("no such sandbox")
	}
	r.mu.Lock()
	r.specs = append(r.specs, s)
	r.mu.Unlock()
	fmt.Fprintf(stderr, "user=%s pty=%v %dx%d term=%s", s.User, s.PTY, s.Cols, s.Rows, s.Envs["TERM"])
	pr, pw := io.Pipe()
	p := &echoProc{in: pw, done: make(chan struct{}), spec: s}
	go func() {
		_, _ = io.Copy(stdout, pr)
		close(p.done)
	}()
	return p, nil
}

type echoProc struct {
	in     *io.PipeWriter
	done   chan struct{}
	spec   Spec
	mu     sync.Mutex
	sizes  []string
	killed bool
}

func (p *echoProc) Input(_ context.Context, b []byte) error { _, err := p.in.Write(b); return err }
func (p *echoProc) CloseInput(context.Context) error        { return p.in.Close() }
func (p *echoProc) Resize(_ context.Context, c, r uint32) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sizes = append(p.sizes, fmt.Sprintf("%dx%d", c, r))
	return nil
}
func (p *echoProc) Kill(context.Context) error {
	p.mu.Lock()
	p.killed = true
	p.mu.Unlock()
	return p.in.Close()
}
func (p *echoProc) Wait(ctx context.Context) (int, string, error) {
	select {
	case <-p.done:
	case <-ctx.Done():
		return 0, "", ctx.Err()
	}
	p.mu.Lock()
	killed := p.killed
	p.mu.Unlock()
	if killed {
		return 0, "KILL", nil
	}
	var code int
	if _, err := fmt.Sscanf(p.spec.Cmd, "exit %d", &code); err == nil {
		return code, "", nil
	}
	return 0, "", nil
}

func dial(t *testing.T, r Runner, user string) *ssh.Client {
	t.Helper()
	srv, cli, err := Pipe()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = Serve(ctx, srv, r, slog.New(slog.DiscardHandler))
	}()
	cc, chans, reqs, err := ssh.NewClientConn(cli, "sbx", &ssh.ClientConfig{User: user, HostKeyCallback: ssh.InsecureIgnoreHostKey()})
	if err != nil {
		t.Fatal(err)
	}
	c := ssh.NewClient(cc, chans, reqs)
	t.Cleanup(func() {
		c.Close()
		cancel()
		<-done
	})
	return c
}

func TestSessions(t *testing.T) {
	for _, tc := range []struct {
		name       string
		user       string
		cmd        string // "" runs a shell
		pty        bool
		env        map[string]string
		stdin      string
		wantOut    string
		wantErr    string // substring of stderr
		wantStatus int    // -1: a signal
	}{
		{name: "exec with stdin and status", user: "user", cmd: "exit 3", stdin: "hello", wantOut: "hello", wantErr: "user=user pty=false", wantStatus: 3},
		{name: "exec as root", user: "root", cmd: "true", stdin: "x", wantOut: "x", wantErr: "user=root"},
		{name: "shell without a terminal", user: "user", stdin: "echo hi\n", wantOut: "echo hi\n"},
		{name: "terminal carries size and TERM", user: "user", pty: true, cmd: "top", wantErr: "pty=true 100x40 term=xterm-test"},
		{name: "a start that fails is status 255", user: "user", cmd: "fail", wantErr: "no such sandbox", wantStatus: 255},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &echoRunner{}
			c := dial(t, r, tc.user)
			s, err := c.NewSession()
			if err != nil {
				t.Fatal(err)
			}
			var out, errb bytes.Buffer
			s.Stdout, s.Stderr = &out, &errb
			if tc.pty {
				if err := s.RequestPty("xterm-test", 40, 100, ssh.TerminalModes{}); err != nil {
					t.Fatal(err)
				}
			}
			in, _ := s.StdinPipe()
			if tc.cmd == "" {
				err = s.Shell()
			} else {
				err = s.Start(tc.cmd)
			}
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.WriteString(in, tc.stdin)
			if tc.pty {
				// A terminal's stdin has no EOF: hang up instead.
				_ = s.Signal(ssh.SIGHUP)
			}
			in.Close()
			err = s.Wait()
			status := 0
			var exit *ssh.ExitError
			if errors.As(err, &exit) {
				status = exit.ExitStatus()
				if exit.Signal() != "" {
					status = -1
				}
			} else if err != nil {
				t.Fatalf("wait: %v", err)
			}
			if tc.pty {
				tc.wantStatus = -1
			}
			if status != tc.wantStatus {
				t.Errorf("status %d, want %d (stderr %q)", status, tc.wantStatus, errb.String())
			}
			// On a terminal stderr is merged into stdout, as sshd does.
			got := out.String() + errb.String()
			if !strings.Contains(out.String(), tc.wantOut) || !strings.Contains(got, tc.wantErr) {
				t.Errorf("stdout %q stderr %q, want %q and %q", out.String(), errb.String(), tc.wantOut, tc.wantErr)
			}
		})
	}
}

func TestEnvAndResize(t *testing.T) {
	r := &echoRunner{}
	c := dial(t, r, "user")
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Setenv("LANG", "C.UTF-8"); err != nil {
		t.Fatal(err)
	}
	in, _ := s.StdinPipe()
	if err := s.Start("true"); err != nil {
		t.Fatal(err)
	}
	in.Close()
	if err := s.Wait(); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.specs) != 1 || r.specs[0].Envs["LANG"] != "C.UTF-8" || r.specs[0].Cmd != "true" {
		t.Fatalf("specs %+v", r.specs)
	}
}

func TestNoForwardingNoOtherSubsystem(t *testing.T) {
	c := dial(t, &echoRunner{}, "user")
	if _, err := c.Dial("tcp", "127.0.0.1:22"); err == nil {
		t.Error("direct-tcpip was accepted")
	}
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.RequestSubsystem("netconf"); err == nil {
		t.Error("an unknown subsystem was accepted")
	}
}

func TestSFTPRunsTheSandboxsServer(t *testing.T) {
	r := &echoRunner{}
	c := dial(t, r, "user")
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	in, _ := s.StdinPipe()
	if err := s.RequestSubsystem("sftp"); err != nil {
		t.Fatal(err)
	}
	in.Close()
	_ = s.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.specs) != 1 || r.specs[0].Cmd != SFTPCommand || r.specs[0].PTY {
		t.Fatalf("specs %+v", r.specs)
	}
}

func TestSignalName(t *testing.T) {
	for status, want := range map[string]string{
		"signal: killed":                           "KILL",
		"signal: terminated":                       "TERM",
		"signal: segmentation fault (core dumped)": "SEGV",
		"signal: hangup":                           "HUP",
		"signal: something new":                    "KILL",
	} {
		if got := signalName(status); got != want {
			t.Errorf("signalName(%q) = %q, want %q", status, got, want)
		}
	}
}
