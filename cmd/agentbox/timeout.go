package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"
)

func newTimeoutCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "timeout <id> <duration>",
		Short: "Set how long from now a sandbox lives (may shorten it)",
		Example: `  agentbox timeout i1a2b3c 30m
  agentbox timeout i1a2b3c 10s`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := time.ParseDuration(args[1])
			if err != nil || d <= 0 {
				return fmt.Errorf("duration %q: want a positive duration like 90s or 1h", args[1])
			}
			return newClient(cmd).SetTimeout(cmd.Context(), args[0], d)
		},
	}
}
