package main

import (
	"errors"
	"fmt"
	"strconv"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store"
)

// quotaFlag is one `team quota set` flag and the field it sets.
type quotaFlag struct {
	flag, field, usage string
	get                func(*store.TeamQuota) *int
	def                func(sandbox.Quota) int
}

// quotaFlags lists the fields in the order they are shown.
func quotaFlags() []quotaFlag {
	return []quotaFlag{
		{"cpu", "cpuCount", "most CPUs one sandbox may ask for", func(q *store.TeamQuota) *int { return &q.CPUCount }, func(q sandbox.Quota) int { return q.CPUCount }},
		{"memory-mb", "memoryMB", "most memory (MiB) one sandbox may ask for", func(q *store.TeamQuota) *int { return &q.MemoryMB }, func(q sandbox.Quota) int { return q.MemoryMB }},
		{"disk-mb", "diskSizeMB", "largest writable disk (MiB) one sandbox may ask for", func(q *store.TeamQuota) *int { return &q.DiskMB }, func(q sandbox.Quota) int { return q.DiskMB }},
		{"pids", "pids", "most processes and threads one sandbox may ask for", func(q *store.TeamQuota) *int { return &q.PIDs }, func(q sandbox.Quota) int { return q.PIDs }},
		{"tmp-mb", "tmpSizeMB", "largest in-memory /tmp (MiB) one sandbox may ask for", func(q *store.TeamQuota) *int { return &q.TmpMB }, func(q sandbox.Quota) int { return q.TmpMB }},
		{"max-sandboxes", "maxSandboxes", "most sandboxes the team may have at once, running, paused or starting (a template build in progress counts as one)", func(q *store.TeamQuota) *int { return &q.MaxSandboxes }, func(q sandbox.Quota) int { return q.MaxSandboxes }},
		{"max-builds", "maxBuilds", "most template builds the team may run at once", func(q *store.TeamQuota) *int { return &q.MaxBuilds }, func(q sandbox.Quota) int { return q.MaxBuilds }},
	}
}

// newTeamCmd is `agentbox team ls` and `agentbox team quota get|set|clear`:
// like `apikey`, it works on the server's own database, for the host's
// administrator. The server reads a team's quota at every create, so a
// change applies to the next create without a restart.
func newTeamCmd() *cobra.Command {
	var dataDir string
	quotaFlags := quotaFlags()
	// withTeam opens the database and finds the team by id or name.
	withTeam := func(cmd *cobra.Command, ref string, f func(*store.Store, store.Team) error) error {
		st, err := openStore(cmd.Context(), dataDir)
		if err != nil {
			return err
		}
		defer st.Close()
		t, err := st.FindTeam(cmd.Context(), ref)
		if errors.Is(err, errdefs.ErrNotFound) {
			return fmt.Errorf("team %q: no team has that id or name; list teams with `agentbox team ls` (a team is created by `agentbox apikey create --team NAME`)", ref)
		}
		if err != nil {
			return err
		}
		return f(st, t)
	}
	cmd := &cobra.Command{
		Use:   "team",
		Short: "List teams and manage their quotas (on the server's data directory)",
		Long: `Work directly on the server's database (run on the server host, as a user
who can read --data-dir). A team's quota caps the limits its creates may ask for
(cpuCount, memoryMB, diskSizeMB, pids, tmpSizeMB), how many sandboxes it may
have at once and how many template builds it may run at once; a field that is
not set takes the server's default. A build's RUN steps run within the same
limits as its sandboxes, and a build in progress counts as one of its
sandboxes. The server reads the quota at every create and build: changes apply
to the next one, no restart.`,
	}
	cmd.PersistentFlags().StringVar(&dataDir, "data-dir", defaultDataDir(), "server data directory")

	ls := &cobra.Command{
		Use:   "ls",
		Short: "List teams with their key count and quota",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := openStore(cmd.Context(), dataDir)
			if err != nil {
				return err
			}
			defer st.Close()
			teams, err := st.ListTeams(cmd.Context())
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprint(tw, "ID\tNAME\tKEYS")
			for _, f := range quotaFlags {
				fmt.Fprint(tw, "\t"+f.field)
			}
			fmt.Fprintln(tw)
			for _, t := range teams {
				fmt.Fprintf(tw, "%s\t%s\t%d", t.ID, t.Name, t.APIKeys)
				for _, f := range quotaFlags {
					fmt.Fprint(tw, "\t"+quotaValue(*f.get(&t.Quota), 0, false))
				}
				fmt.Fprintln(tw)
			}
			return tw.Flush()
		},
	}

	quota := &cobra.Command{
		Use:   "quota",
		Short: "Show, set or clear a team's quota",
	}
	get := &cobra.Command{
		Use:   "get <team>",
		Short: "Show a team's quota (by team id or name) and what each field resolves to",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withTeam(cmd, args[0], func(st *store.Store, t store.Team) error {
				q, _, err := st.TeamQuota(cmd.Context(), t.ID)
				if err != nil {
					return err
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintf(tw, "team\t%s (%s)\n", t.Name, t.ID)
				for _, f := range quotaFlags {
					fmt.Fprintf(tw, "%s\t%s\n", f.field, quotaValue(*f.get(&q), f.def(sandbox.DefaultQuota()), true))
				}
				return tw.Flush()
			})
		},
	}
	set := &cobra.Command{
		Use:   "set <team> [--cpu N] [--memory-mb N] [--disk-mb N] [--pids N] [--tmp-mb N] [--max-sandboxes N] [--max-builds N]",
		Short: "Set fields of a team's quota (others keep their value; 0 = the server's default)",
		Example: `  agentbox team quota set research --memory-mb 4096 --max-sandboxes 10
  agentbox team quota set research --memory-mb 0   # back to the server's default`,
		Args: cobra.ExactArgs(1),
	}
	vals := make([]int, len(quotaFlags))
	for i, f := range quotaFlags {
		set.Flags().IntVar(&vals[i], f.flag, 0, f.usage+"; 0 = the server's default")
	}
	set.RunE = func(cmd *cobra.Command, args []string) error {
		changed := false
		for i, f := range quotaFlags {
			if !cmd.Flags().Changed(f.flag) {
				continue
			}
			if vals[i] < 0 {
				return fmt.Errorf("--%s: must not be negative, got %d (0 = the server's default)", f.flag, vals[i])
			}
			changed = true
		}
		if !changed {
			return errors.New("nothing to set: give at least one of --cpu, --memory-mb, --disk-mb, --pids, --tmp-mb, --max-sandboxes, --max-builds")
		}
		return withTeam(cmd, args[0], func(st *store.Store, t store.Team) error {
			q, _, err := st.TeamQuota(cmd.Context(), t.ID)
			if err != nil {
				return err
			}
			for i, f := range quotaFlags {
				if cmd.Flags().Changed(f.flag) {
					*f.get(&q) = vals[i]
				}
			}
			if q == (store.TeamQuota{}) {
				return st.ClearTeamQuota(cmd.Context(), t.ID)
			}
			return st.SetTeamQuota(cmd.Context(), t.ID, q)
		})
	}
	clr := &cobra.Command{
		Use:   "clear <team>",
		Short: "Remove a team's quota: every field takes the server's default",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withTeam(cmd, args[0], func(st *store.Store, t store.Team) error {
				return st.ClearTeamQuota(cmd.Context(), t.ID)
			})
		},
	}
	quota.AddCommand(get, set, clr)
	cmd.AddCommand(ls, quota)
	return cmd
}

// quotaValue shows a stored quota field: its value, or the server's
// default when unset (0).
func quotaValue(v, def int, showDefault bool) string {
	switch {
	case v > 0:
		return strconv.Itoa(v)
	case !showDefault:
		return "-"
	case def > 0:
		return fmt.Sprintf("default (%d)", def)
	}
	return "default (no cap)"
}
