package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/agentbox/agentbox/internal/localrun"
)

// newRunCmd is `agentbox run`: the local process tier, no server needed.
func newRunCmd() *cobra.Command {
	var (
		flags        localrun.Config
		configFile   string
		logFile      string
		explainFiles bool
		noLandlock   bool
	)
	cmd := &cobra.Command{
		Use:   "run [flags] -- <command> [args...]",
		Short: "Run a local command with Landlock, seccomp and a proxy-only network (no server needed)",
		Long: `Run a command on this machine as the current user, confined:

  files    it reads everything except credential stores (~/.ssh, ~/.aws,
           ~/.gnupg, ~/.config/gcloud, ~/.kube, ~/.docker/config.json, ~/.netrc,
           ./.env, ...) and writes only the working directory, /tmp and the
           --write paths (Landlock);
  syscalls no tracing of other processes, no mounts or new namespaces, no
           MPTCP, raw or packet sockets, no keyrings, BPF or userfaultfd (seccomp);
  network  its own network namespace with only loopback; the way out is
           agentbox's HTTP proxy (HTTP_PROXY and HTTPS_PROXY are set), which
           lets through the --allow-net domains and refuses the rest.

Every refusal agentbox can see is explained on stderr in one line with the
flag that allows it, and logged as a JSON record with --log. Flags add to
the project's .agentbox.json (or --config FILE), whose fields are read,
write, deny_read, allow_net and no_default_deny.

Needs Landlock and user namespaces (unprivileged ones when not root); it
refuses to run, saying why, where the kernel lacks them (--allow-no-landlock
accepts running without Landlock). Exits with the command's exit status.`,
		Example: `  agentbox run -- make test
  agentbox run --allow-net proxy.golang.org --allow-net sum.golang.org -- go build ./...
  agentbox run --write ~/.cache/go-build -- go test ./...
  agentbox run --read ~/.ssh/known_hosts -- git fetch`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir, err := os.Getwd()
			if err != nil {
				return fmt.Errorf("working directory: %w", err)
			}
			home, err := os.UserHomeDir()
			if err != nil {
				return fmt.Errorf("home directory: %w (set $HOME)", err)
			}
			required := configFile != ""
			if !required {
				configFile = filepath.Join(dir, localrun.ConfigFile)
			}
			cfg, err := localrun.LoadConfig(configFile, required)
			if err != nil {
				return err
			}
			if err := flags.Validate(); err != nil {
				return fmt.Errorf("flags: %w", err)
			}
			var logOut io.Writer = io.Discard
			if logFile != "" {
				f, err := os.OpenFile(logFile, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
				if err != nil {
					return fmt.Errorf("--log: %w", err)
				}
				defer f.Close()
				logOut = f
			}
			self, err := os.Executable()
			if err != nil {
				return fmt.Errorf("finding the agentbox binary to re-execute: %w", err)
			}
			code, err := localrun.Run(cmd.Context(), localrun.Options{
				Config: cfg.Merge(flags),
				Env: localrun.Env{Home: home, Dir: dir, TmpDir: os.TempDir(),
					RuntimeDir: os.Getenv("XDG_RUNTIME_DIR"), AuthSock: os.Getenv("SSH_AUTH_SOCK")},
				Args:            args,
				Self:            self,
				Stderr:          cmd.ErrOrStderr(),
				Log:             slog.New(slog.NewJSONHandler(logOut, nil)),
				ExplainFiles:    explainFiles,
				AllowNoLandlock: noLandlock,
			})
			var helper *localrun.HelperError
			if errors.As(err, &helper) {
				return &exitCodeError{code: helper.Code}
			}
			if err != nil {
				return err
			}
			if code != 0 {
				return &exitCodeError{code: code}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&flags.Read, "read", nil, "allow reading a path the defaults deny (repeatable)")
	f.StringArrayVar(&flags.Write, "write", nil, "allow writing under a path, besides the working directory and /tmp (repeatable)")
	f.StringArrayVar(&flags.DenyRead, "deny-read", nil, "deny reading a path or glob, besides the default credential stores (repeatable)")
	f.StringArrayVar(&flags.AllowNet, "allow-net", nil, `let the proxy reach a domain or IP literal; "*.example.com" for subdomains (repeatable)`)
	f.BoolVar(&flags.NoDefaultDeny, "no-default-deny", false, "do not deny the default credential stores")
	f.StringVar(&configFile, "config", "", "config file (default ./"+localrun.ConfigFile+" when present)")
	f.StringVar(&logFile, "log", "", "append a JSON record of every refusal and proxy decision to this file")
	f.BoolVar(&noLandlock, "allow-no-landlock", false, "run even where the kernel lacks Landlock: writes are then not restricted and denied paths are masked")
	f.BoolVar(&explainFiles, "explain-files", true, "explain refused file reads and writes (sends every open through agentbox; false is faster)")
	return cmd
}
