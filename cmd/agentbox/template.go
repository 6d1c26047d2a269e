package main

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/agentbox/agentbox/internal/template"
)

func newTemplateCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "template",
		Short: "List templates (server) or build them (locally)",
	}
	cmd.AddCommand(newTemplateLsCmd(), newTemplateBuildCmd())
	return cmd
}

func newTemplateLsCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List the templates the server can start sandboxes from",
		Example: `  agentbox template ls`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			list, err := newClient(cmd).ListTemplates(cmd.Context())
			if err != nil {
				return err
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			fmt.Fprintln(w, "TEMPLATE ID\tALIASES\tCPU\tMEMORY\tDISK\tCREATED")
			for _, t := range list {
				created := "-"
				if !t.CreatedAt.IsZero() {
					created = t.CreatedAt.Local().Format("2006-01-02 15:04")
				}
				fmt.Fprintf(w, "%s\t%s\t%d\t%d MB\t%d MB\t%s\n", t.TemplateID, strings.Join(t.Aliases, ","),
					t.CPUCount, t.MemoryMB, t.DiskSizeMB, created)
			}
			return w.Flush()
		},
	}
}

func newTemplateBuildCmd() *cobra.Command {
	var dir string
	builtins := template.BuiltinDefinitions()
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range builtins {
			if !yield(n) {
				return
			}
		}
	})
	cmd := &cobra.Command{
		Use:   "build [name]",
		Short: "Build a builtin template on this machine (needs root and mmdebstrap)",
		Long: fmt.Sprintf(`Build a builtin template (default "base"; known: %s) from Debian packages
with mmdebstrap into --template-dir, where "agentbox serve" finds it. A build
with the same inputs as an existing template is skipped.`, strings.Join(names, ", ")),
		Example: `  sudo agentbox template build
  sudo agentbox template build base --template-dir /srv/agentbox/templates`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := "base"
			if len(args) == 1 {
				name = args[0]
			}
			def, ok := builtins[name]
			if !ok {
				return fmt.Errorf("no builtin template %q (known: %s)", name, strings.Join(names, ", "))
			}
			if os.Geteuid() != 0 {
				return fmt.Errorf("building a template needs root (mmdebstrap --mode=root)")
			}
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn}))
			store, err := template.NewStore(dir, log)
			if err != nil {
				return err
			}
			_, err = store.Build(cmd.Context(), def, cmd.OutOrStdout())
			return err
		},
	}
	cmd.Flags().StringVar(&dir, "template-dir", filepath.Join(defaultDataDir(), "templates"), "directory templates are stored in")
	return cmd
}
