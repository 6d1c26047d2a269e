package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/crypto/ssh"
	"golang.org/x/term"

	"github.com/agentbox/agentbox/internal/sshserver"
)

func newSSHCmd() *cobra.Command {
	var user string
	var stdio, tty bool
	cmd := &cobra.Command{
		Use:   "ssh <id> [-- command...]",
		Short: "SSH into a sandbox (also an OpenSSH ProxyCommand)",
		Long: `Open an SSH session in a sandbox: an interactive login shell on a terminal,
or a command with its stdin, stdout, stderr and exit status.

Nothing listens for SSH, on the host or in the sandbox: the SSH protocol is
served by this process, and each shell or command runs through the server's
data plane with the API key and the sandbox's access token, admitted,
throttled and audited like any terminal an SDK opens. There is no SSH
password or key to manage; the SSH user is the sandbox's OS user.

With --stdio the command speaks SSH on its stdin and stdout for OpenSSH's
ProxyCommand; the sandbox id is the host name up to its first dot, so
"i1a2b3c" and "i1a2b3c.sandbox" both work. The host key is made anew for
each connection (it authenticates only the pipe; the HTTPS connection to
the server authenticates the sandbox), hence the known-hosts options:

  ssh -o ProxyCommand='agentbox ssh --stdio %h' \
      -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null user@i1a2b3c

or once in ~/.ssh/config, then "ssh user@i1a2b3c.sandbox", and sftp, scp
and rsync when the template has their sandbox side (openssh-sftp-server for
sftp and scp, rsync for rsync):

  Host *.sandbox
      ProxyCommand agentbox ssh --stdio %h
      StrictHostKeyChecking no
      UserKnownHostsFile /dev/null
      LogLevel ERROR

The API key comes from --api-key, AGENTBOX_API_KEY or E2B_API_KEY, as for
every command. A paused sandbox is resumed, as connect does. There is no
port forwarding (use agentbox port-forward). --stdio serves whoever holds
its stdin: never put it behind a listening socket.`,
		Example: `  agentbox ssh i1a2b3c
  agentbox ssh i1a2b3c --user root -- cat /etc/os-release
  ssh -o ProxyCommand='agentbox ssh --stdio %h' -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null user@i1a2b3c 'uname -a'`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			id, _, _ := strings.Cut(args[0], ".")
			if stdio {
				if len(args) > 1 {
					return errors.New("--stdio takes only the sandbox id: the command comes from the SSH client")
				}
				return serveSSH(ctx, cmd, id, stdioConn{})
			}
			return runSSH(ctx, cmd, id, user, strings.Join(args[1:], " "), tty)
		},
	}
	cmd.Flags().BoolVar(&stdio, "stdio", false, "speak SSH on stdin/stdout, for OpenSSH's ProxyCommand")
	cmd.Flags().StringVar(&user, "user", "", "the sandbox's OS user to run as (default: the template's user)")
	cmd.Flags().BoolVarP(&tty, "tty", "t", false, "run the command on a terminal even when one is given")
	return cmd
}

// serveSSH serves SSH on conn with the sandbox's data plane behind it.
func serveSSH(ctx context.Context, cmd *cobra.Command, id string, conn net.Conn) error {
	sbx, err := connect(ctx, cmd, id)
	if err != nil {
		// OpenSSH shows the proxy's stderr: say why before the pipe closes.
		return err
	}
	log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	return sshserver.Serve(ctx, conn, sshserver.SandboxRunner{Sandbox: sbx}, log)
}

// runSSH is the CLI's own SSH client, over a pipe to serveSSH in this
// process: the same sessions OpenSSH gets, without needing OpenSSH.
func runSSH(ctx context.Context, cmd *cobra.Command, id, user, command string, tty bool) error {
	sbx, err := connect(ctx, cmd, id)
	if err != nil {
		return err
	}
	srv, cli, err := sshserver.Pipe()
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	go func() { _ = sshserver.Serve(ctx, srv, sshserver.SandboxRunner{Sandbox: sbx}, log) }()
	cc, chans, reqs, err := ssh.NewClientConn(cli, id, &ssh.ClientConfig{
		User: user,
		// The server end is this process (see sshserver.Serve).
		HostKeyCallback: ssh.InsecureIgnoreHostKey(),
		Timeout:         30 * time.Second,
	})
	if err != nil {
		return err
	}
	client := ssh.NewClient(cc, chans, reqs)
	defer client.Close()
	sess, err := client.NewSession()
	if err != nil {
		return err
	}
	defer sess.Close()
	sess.Stdout, sess.Stderr = cmd.OutOrStdout(), cmd.ErrOrStderr()
	stdin := int(os.Stdin.Fd())
	onTerm := term.IsTerminal(stdin) && (command == "" || tty)
	if onTerm {
		cols, rows, err := term.GetSize(stdin)
		if err != nil {
			cols, rows = 80, 24
		}
		if err := sess.RequestPty(firstNonEmpty(os.Getenv("TERM"), "xterm-256color"), rows, cols, ssh.TerminalModes{}); err != nil {
			return fmt.Errorf("terminal: %w", err)
		}
		state, err := term.MakeRaw(stdin)
		if err != nil {
			return fmt.Errorf("raw mode: %w", err)
		}
		defer term.Restore(stdin, state)
		defer followWindowSize(stdin, func(c, r int) { _ = sess.WindowChange(r, c) })()
	}
	// Stdin is copied by hand, not through sess.Stdin: a terminal's
	// reader never ends and would keep Wait from returning.
	in, err := sess.StdinPipe()
	if err != nil {
		return err
	}
	go func() {
		_, _ = io.Copy(in, os.Stdin)
		if !onTerm {
			_ = in.Close()
		}
	}()
	if command == "" {
		err = sess.Shell()
	} else {
		err = sess.Start(command)
	}
	if err != nil {
		return err
	}
	err = sess.Wait()
	var exit *ssh.ExitError
	switch {
	case errors.As(err, &exit) && exit.Signal() != "":
		return &exitCodeError{137}
	case errors.As(err, &exit):
		return &exitCodeError{exit.ExitStatus()}
	}
	return err
}

// stdioConn is the process's stdin and stdout as a net.Conn.
type stdioConn struct{}

func (stdioConn) Read(p []byte) (int, error)       { return os.Stdin.Read(p) }
func (stdioConn) Write(p []byte) (int, error)      { return os.Stdout.Write(p) }
func (stdioConn) Close() error                     { return errors.Join(os.Stdin.Close(), os.Stdout.Close()) }
func (stdioConn) LocalAddr() net.Addr              { return stdioAddr{} }
func (stdioConn) RemoteAddr() net.Addr             { return stdioAddr{} }
func (stdioConn) SetDeadline(time.Time) error      { return nil }
func (stdioConn) SetReadDeadline(time.Time) error  { return nil }
func (stdioConn) SetWriteDeadline(time.Time) error { return nil }

type stdioAddr struct{}

func (stdioAddr) Network() string { return "stdio" }
func (stdioAddr) String() string  { return "stdio" }
