package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// newAPIKeyCmd is `agentbox apikey create|ls|rm` (owned by the server work).
func newAPIKeyCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "apikey",
		Short: "Manage API keys in the local data directory",
		RunE: func(cmd *cobra.Command, args []string) error {
			return errors.New("apikey: not built yet")
		},
	}
}
