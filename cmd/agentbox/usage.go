package main

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

func newUsageCmd() *cobra.Command {
	var (
		from, to string
		asJSON   bool
	)
	cmd := &cobra.Command{
		Use:   "usage",
		Short: "Show the team's metered usage: vCPU-seconds, memory GiB-seconds, disk and snapshot GiB-hours, egress bytes",
		Long: `Show the team's metered usage, per sandbox and in total. CPU and memory
accrue only while a sandbox runs; paused sandboxes accrue disk only.
Usage is kept hourly, so the window widens to the whole hours it touches.`,
		Example: `  agentbox usage
  agentbox usage --from 2026-01-01T00:00:00Z --to 2026-02-01T00:00:00Z --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var f, t time.Time
			for _, p := range []struct {
				name, v string
				dst     *time.Time
			}{{"--from", from, &f}, {"--to", to, &t}} {
				if p.v == "" {
					continue
				}
				v, err := time.Parse(time.RFC3339, p.v)
				if err != nil {
					return fmt.Errorf("%s: must be an RFC 3339 time such as 2026-01-02T15:04:05Z, got %q", p.name, p.v)
				}
				*p.dst = v
			}
			if !f.IsZero() && !t.IsZero() && f.After(t) {
				return fmt.Errorf("--from %s is after --to %s", from, to)
			}
			u, err := newClient(cmd).Usage(cmd.Context(), f, t)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(u)
			}
			fmt.Fprintf(out, "Team %s, %s to %s\n", u.TeamID, u.From.Format(time.RFC3339), u.To.Format(time.RFC3339))
			w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
			fmt.Fprintln(w, "SANDBOX ID\tTEMPLATE\tVCPU-S\tMEM GIB-S\tDISK GIB-H\tEGRESS")
			for _, s := range u.Sandboxes {
				fmt.Fprintf(w, "%s\t%s\t%.1f\t%.1f\t%.4f\t%s\n", s.SandboxID, s.TemplateID, s.CPUSeconds, s.MemoryGiBSeconds, s.DiskGiBHours, byteSize(s.EgressBytes))
			}
			tt := u.Totals
			fmt.Fprintf(w, "TOTAL\t\t%.1f\t%.1f\t%.4f\t%s\n", tt.CPUSeconds, tt.MemoryGiBSeconds, tt.DiskGiBHours, byteSize(tt.EgressBytes))
			if err := w.Flush(); err != nil {
				return err
			}
			fmt.Fprintf(out, "Snapshots: %.4f GiB-hours\n", tt.SnapshotGiBHours)
			return nil
		},
	}
	cmd.Flags().StringVar(&from, "from", "", "start of the window, RFC 3339 (default 30 days before --to)")
	cmd.Flags().StringVar(&to, "to", "", "end of the window, RFC 3339 (default now)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the API's JSON")
	return cmd
}

// byteSize prints n bytes with a binary unit.
func byteSize(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
