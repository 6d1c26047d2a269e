package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	agentbox "github.com/agentbox/agentbox/sdk/go"
)

func newLogsCmd() *cobra.Command {
	var (
		follow bool
		asJSON bool
		since  time.Duration
		limit  int
		kinds  []string
		egress bool
	)
	cmd := &cobra.Command{
		Use:   "logs <id>",
		Short: "Print a sandbox's audit log: lifecycle, processes, file changes, egress, limits, refused syscalls",
		Long: `Print the audit log of a sandbox: every lifecycle change, process start
and exit (user, command, cwd, pid, exit code, duration), file write, move and
removal through the API, egress decision and limit hit (out of memory,
process limit, full disk) with the reason. The log outlives the sandbox.`,
		Example: `  agentbox logs i1a2b3c
  agentbox logs i1a2b3c --follow --kind process,limit`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if egress {
				kinds = append(kinds, "egress")
			}
			opts := agentbox.LogsOptions{Limit: limit, Kinds: kinds}
			if since > 0 {
				opts.Since = time.Now().Add(-since)
			}
			out := cmd.OutOrStdout()
			print := func(e agentbox.LogEntry) error { return printLogEntry(out, e, asJSON) }
			c := newClient(cmd)
			if follow {
				return c.FollowLogs(cmd.Context(), args[0], opts, print)
			}
			entries, err := c.Logs(cmd.Context(), args[0], opts)
			if err != nil {
				return err
			}
			for _, e := range entries {
				if err := print(e); err != nil {
					return err
				}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVarP(&follow, "follow", "f", false, "keep printing new events as they happen")
	f.BoolVar(&asJSON, "json", false, "print one JSON object per event")
	f.DurationVar(&since, "since", 0, "only events of the last duration, e.g. 10m")
	f.IntVar(&limit, "limit", 0, "only the newest N events (server default 1000)")
	f.StringSliceVar(&kinds, "kind", nil, "only these kinds: lifecycle, process, file, egress, limit, syscall")
	f.BoolVar(&egress, "egress", false, "only egress events (same as --kind egress): every outbound connection, request and lookup with its verdict")
	return cmd
}

func printLogEntry(w io.Writer, e agentbox.LogEntry, asJSON bool) error {
	if asJSON {
		return json.NewEncoder(w).Encode(e)
	}
	_, err := fmt.Fprintf(w, "%s %-5s %s\n", e.Timestamp.Local().Format("15:04:05.000"), strings.ToUpper(e.Level), e.Message)
	return err
}
