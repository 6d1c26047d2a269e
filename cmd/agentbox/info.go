package main

import (
	"encoding/json"

	"github.com/spf13/cobra"
)

func newInfoCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "info <id>",
		Short:   "Print a sandbox's details as JSON",
		Example: `  agentbox info i1a2b3c | jq .endAt`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			info, err := newClient(cmd).GetInfo(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			enc := json.NewEncoder(cmd.OutOrStdout())
			enc.SetIndent("", "  ")
			return enc.Encode(info)
		},
	}
}
