package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"
)

func newKillCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "kill <id>...",
		Aliases: []string{"rm"},
		Short:   "Kill sandboxes and delete them",
		Example: `  agentbox kill i1a2b3c
  agentbox kill $(agentbox ls | awk 'NR>1 {print $1}')`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c := newClient(cmd)
			var errs []error
			for _, id := range args {
				if err := c.Kill(cmd.Context(), id); err != nil {
					errs = append(errs, err)
					continue
				}
				fmt.Fprintln(cmd.OutOrStdout(), id)
			}
			return errors.Join(errs...)
		},
	}
}
