package main

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	agentbox "github.com/agentbox/agentbox/sdk/go"
)

func newLsCmd() *cobra.Command {
	var (
		metadata []string
		states   []string
	)
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List sandboxes",
		Example: `  agentbox ls
  agentbox ls --state running --metadata owner=alice`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			md, err := parsePairs("metadata", metadata)
			if err != nil {
				return err
			}
			list, err := newClient(cmd).List(cmd.Context(), agentbox.ListOptions{Metadata: md, State: states})
			if err != nil {
				return err
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			fmt.Fprintln(w, "SANDBOX ID\tTEMPLATE\tSTATE\tSTARTED\tENDS IN\tCPU\tMEMORY\tMETADATA")
			for _, s := range list {
				tpl := s.Alias
				if tpl == "" {
					tpl = s.TemplateID
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\t%d MB\t%s\n", s.SandboxID, tpl, s.State,
					ago(s.StartedAt), until(s.EndAt), s.CPUCount, s.MemoryMB, formatPairs(s.Metadata))
			}
			return w.Flush()
		},
	}
	cmd.Flags().StringArrayVar(&metadata, "metadata", nil, "only sandboxes with KEY=VALUE metadata (repeatable)")
	cmd.Flags().StringSliceVar(&states, "state", nil, "only these states: running, paused (comma-separated)")
	return cmd
}

func ago(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return time.Since(t).Round(time.Second).String() + " ago"
}

func until(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := time.Until(t).Round(time.Second)
	if d < 0 {
		return "expired"
	}
	return d.String()
}

func formatPairs(m map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, k+"="+m[k])
	}
	return strings.Join(parts, ",")
}
