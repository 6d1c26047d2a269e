package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	agentbox "github.com/agentbox/agentbox/sdk/go"
)

func newShellCmd() *cobra.Command {
	var user, cwd string
	cmd := &cobra.Command{
		Use:   "shell <id>",
		Short: "Open an interactive shell in a sandbox",
		Long: `Open an interactive login bash on a terminal in the sandbox. The local
terminal is put in raw mode and its size follows the window. The command
ends when the shell exits, with the shell's exit code.`,
		Example: `  agentbox shell i1a2b3c
  agentbox shell i1a2b3c --user root --cwd /`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			stdin := int(os.Stdin.Fd())
			if !term.IsTerminal(stdin) {
				return errors.New("shell needs a terminal on stdin; use exec for scripts")
			}
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			sbx, err := connect(ctx, cmd, args[0])
			if err != nil {
				return err
			}
			cols, rows, err := term.GetSize(stdin)
			if err != nil {
				cols, rows = 80, 24
			}
			h, err := sbx.PTY.Create(ctx, agentbox.PTYOptions{
				Cols: uint16(cols), Rows: uint16(rows), User: user, Cwd: cwd,
				OnData: func(b []byte) { _, _ = os.Stdout.Write(b) },
			})
			if err != nil {
				return err
			}
			state, err := term.MakeRaw(stdin)
			if err != nil {
				_ = h.Kill(ctx)
				return fmt.Errorf("raw mode: %w", err)
			}
			defer term.Restore(stdin, state)

			defer followWindowSize(stdin, func(c, r int) { _ = h.Resize(ctx, uint16(c), uint16(r)) })()
			go func() {
				buf := make([]byte, 4096)
				for {
					n, err := os.Stdin.Read(buf)
					if n > 0 && h.SendInput(ctx, buf[:n]) != nil {
						return
					}
					if err != nil {
						return
					}
				}
			}()
			_, err = h.Wait(ctx)
			term.Restore(stdin, state)
			var exit *agentbox.CommandExitError
			if errors.As(err, &exit) {
				return &exitCodeError{max(exit.ExitCode, 1)}
			}
			return err
		},
	}
	cmd.Flags().StringVar(&user, "user", "", "log in as this user (default: the template's user)")
	cmd.Flags().StringVar(&cwd, "cwd", "", "start in this directory (default: the template's workdir)")
	return cmd
}

// followWindowSize calls resize with the terminal fd's size whenever it
// changes (SIGWINCH) until the returned stop is called.
func followWindowSize(fd int, resize func(cols, rows int)) (stop func()) {
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	go func() {
		for range winch {
			if c, r, err := term.GetSize(fd); err == nil {
				resize(c, r)
			}
		}
	}()
	return func() { signal.Stop(winch); close(winch) }
}
