package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	agentbox "github.com/agentbox/agentbox/sdk/go"
)

func newCreateCmd() *cobra.Command {
	var (
		timeout  time.Duration
		metadata []string
		envs     []string
	)
	cmd := &cobra.Command{
		Use:   "create [template]",
		Short: "Create a sandbox and print its id",
		Long:  "Create a sandbox from a template (id or alias, default \"base\") and print its id.",
		Example: `  agentbox create
  agentbox create base --timeout 1h --metadata owner=alice --env DEBUG=1
  id=$(agentbox create) && agentbox exec $id -- uname -a`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			md, err := parsePairs("metadata", metadata)
			if err != nil {
				return err
			}
			env, err := parsePairs("env", envs)
			if err != nil {
				return err
			}
			opts := agentbox.CreateOptions{Timeout: timeout, Metadata: md, EnvVars: env}
			if len(args) == 1 {
				opts.Template = args[0]
			}
			sbx, err := newClient(cmd).Create(cmd.Context(), opts)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), sbx.ID)
			return nil
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Minute, "lifetime before the sandbox is killed")
	cmd.Flags().StringArrayVar(&metadata, "metadata", nil, "KEY=VALUE metadata (repeatable)")
	cmd.Flags().StringArrayVar(&envs, "env", nil, "KEY=VALUE environment for every process (repeatable)")
	return cmd
}
