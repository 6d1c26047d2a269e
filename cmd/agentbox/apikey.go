package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/agentbox/agentbox/internal/store"
)

// newAPIKeyCmd is `agentbox apikey create|ls|rm`: key management on the
// server's own database, for the host's administrator (no API call: this is
// how the first keys of new teams are minted).
// openStore opens the server's database in dataDir (apikey, team).
func openStore(ctx context.Context, dataDir string) (*store.Store, error) {
	return store.Open(ctx, filepath.Join(dataDir, "agentbox.db"))
}

func newAPIKeyCmd() *cobra.Command {
	var dataDir string
	cmd := &cobra.Command{
		Use:   "apikey",
		Short: "Create, list and remove API keys (on the server's data directory)",
		Long: `Manage API keys directly in the server's database (run on the server host,
as a user who can read --data-dir). Keys are stored hashed; a new key is shown
once. Each key belongs to a team; a team sees only its own sandboxes.`,
	}
	cmd.PersistentFlags().StringVar(&dataDir, "data-dir", defaultDataDir(), "server data directory")

	var team, name string
	var kubeKey kubeKeyFlags
	create := &cobra.Command{
		Use:     "create",
		Short:   "Create a key and print it (shown only once)",
		Example: "  agentbox apikey create --team research --name ci",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if !store.ValidTeamName(team) {
				return fmt.Errorf("--team %q: use 1-64 letters, digits, '-', '_' or '.'", team)
			}
			if kubeKey.enabled {
				return createKubeKey(cmd.Context(), cmd.OutOrStdout(), kubeKey, team, name) // apikey_kube.go
			}
			st, err := openStore(cmd.Context(), dataDir)
			if err != nil {
				return err
			}
			defer st.Close()
			t, err := st.EnsureTeam(cmd.Context(), team)
			if err != nil {
				return err
			}
			plain, _, err := st.CreateAPIKey(cmd.Context(), t.ID, name)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), plain)
			return nil
		},
	}
	create.Flags().StringVar(&team, "team", "default", "team the key belongs to (created if new)")
	create.Flags().StringVar(&name, "name", "", "a note to recognise the key by")
	addKubeKeyFlags(create.Flags(), &kubeKey)

	ls := &cobra.Command{
		Use:   "ls",
		Short: "List keys (masked)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := openStore(cmd.Context(), dataDir)
			if err != nil {
				return err
			}
			defer st.Close()
			keys, err := st.ListAPIKeys(cmd.Context())
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tKEY\tTEAM\tNAME\tCREATED")
			for _, k := range keys {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", k.ID, k.Mask, k.TeamName, k.Name, k.CreatedAt.Format("2006-01-02 15:04"))
			}
			return tw.Flush()
		},
	}
	rm := &cobra.Command{
		Use:   "rm <key-id>...",
		Short: "Remove keys by the ID shown by `apikey ls`",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := openStore(cmd.Context(), dataDir)
			if err != nil {
				return err
			}
			defer st.Close()
			for _, id := range args {
				if err := st.DeleteAPIKey(cmd.Context(), id); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.AddCommand(create, ls, rm)
	return cmd
}

// defaultDataDir is $AGENTBOX_DATA_DIR or /var/lib/agentbox.
func defaultDataDir() string {
	if d := os.Getenv("AGENTBOX_DATA_DIR"); d != "" {
		return d
	}
	return "/var/lib/agentbox"
}
