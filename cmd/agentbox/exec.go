package main

import (
	"context"
	"errors"
	"io"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	agentbox "github.com/agentbox/agentbox/sdk/go"
)

func newExecCmd() *cobra.Command {
	var (
		user, cwd string
		envs      []string
		timeout   time.Duration
	)
	cmd := &cobra.Command{
		Use:   "exec <id> [flags] -- <command> [args...]",
		Short: "Run a command in a sandbox",
		Long: `Run a command in a sandbox with "bash -l -c", streaming its stdout and stderr,
and exit with its exit code. A single argument is passed to bash as is, so it
may use pipes and variables; several arguments are quoted one by one.
When stdin is not a terminal it is forwarded to the command.`,
		Example: `  agentbox exec i1a2b3c -- ls -la /home/user
  agentbox exec i1a2b3c -- 'echo $HOME | tr a-z A-Z'
  echo 'print(1+1)' | agentbox exec i1a2b3c -- python3 -
  agentbox exec i1a2b3c --user root --cwd /etc --env A=1 -- printenv A`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			env, err := parsePairs("env", envs)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			sbx, err := connect(ctx, cmd, args[0])
			if err != nil {
				return err
			}
			stdout, stderr := cmd.OutOrStdout(), cmd.ErrOrStderr()
			opts := []agentbox.CommandOption{
				agentbox.WithEnvs(env), agentbox.WithCwd(cwd), agentbox.WithUser(user),
				agentbox.WithTimeout(timeout),
				agentbox.WithOnStdout(func(b []byte) { _, _ = stdout.Write(b) }),
				agentbox.WithOnStderr(func(b []byte) { _, _ = stderr.Write(b) }),
			}
			in := cmd.InOrStdin()
			forward := !isTerminal(in)
			if forward {
				opts = append(opts, agentbox.WithStdin())
			}
			h, err := sbx.Commands.Start(ctx, commandLine(args[1:]), opts...)
			if err != nil {
				return err
			}
			if forward {
				go forwardStdin(ctx, h, in)
			}
			sigs := make(chan os.Signal, 1)
			signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
			defer signal.Stop(sigs)
			select {
			case <-h.Done():
			case <-sigs:
				// Do not leave the command running behind the user's back.
				kctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = h.Kill(kctx)
				return &exitCodeError{130}
			}
			_, err = h.Wait(ctx)
			var exit *agentbox.CommandExitError
			if errors.As(err, &exit) {
				if exit.ExitCode < 0 {
					return &exitCodeError{137}
				}
				return &exitCodeError{exit.ExitCode}
			}
			return err
		},
	}
	cmd.Flags().StringVar(&user, "user", "", "run as this user (default: the template's user)")
	cmd.Flags().StringVar(&cwd, "cwd", "", "working directory (default: the template's workdir)")
	cmd.Flags().StringArrayVar(&envs, "env", nil, "KEY=VALUE environment variable (repeatable)")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "kill the command after this long (default: no limit)")
	return cmd
}

// forwardStdin copies r to the process's stdin, then closes it.
func forwardStdin(ctx context.Context, h *agentbox.CommandHandle, r io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if h.SendStdin(ctx, buf[:n]) != nil {
				return
			}
		}
		if err != nil {
			_ = h.CloseStdin(ctx)
			return
		}
	}
}

func isTerminal(r io.Reader) bool {
	f, ok := r.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

var shellSafe = regexp.MustCompile(`^[A-Za-z0-9_@%+=:,./-]+$`)

// commandLine joins argv for bash -c. One argument is taken as a script.
func commandLine(args []string) string {
	if len(args) == 1 {
		return args[0]
	}
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = shellQuote(a)
	}
	return strings.Join(quoted, " ")
}

func shellQuote(s string) string {
	if shellSafe.MatchString(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
