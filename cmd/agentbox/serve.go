package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// newServeCmd is the `agentbox serve` command (owned by the server work).
func newServeCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "serve",
		Short: "Run the agentbox server (API, gateway, sandboxes)",
		RunE: func(cmd *cobra.Command, args []string) error {
			return errors.New("serve: not built yet")
		},
	}
}
