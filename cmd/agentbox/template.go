package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/agentbox/agentbox/internal/template"
)

func newTemplateCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "template",
		Short: "Build, list, inspect and remove your team's templates; operator commands for the server's template store",
		Long: `Templates belong to the team of the API key: names, tags, builds and deletion
are that team's alone. Every team also sees the server's builtins (base,
code-interpreter-v1, browser, desktop) and the templates an operator
published.

Team commands (through the server's API): build -f, ls, inspect, rm.
Operator commands (on the server's host, as root, on --template-dir): build
<builtin>, publish, unpublish, gc, usage.`,
	}
	cmd.AddCommand(newTemplateLsCmd(), newTemplateBuildCmd(), newTemplateRmCmd(), newTemplateInspectCmd(),
		newTemplateGCCmd(), newTemplateUsageCmd(), newTemplatePublishCmd(true), newTemplatePublishCmd(false))
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

func newTemplateRmCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "rm <template>...",
		Aliases: []string{"delete"},
		Short:   "Delete templates (their layers stay until \"template gc\" while other templates or sandboxes use them)",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, id := range args {
				if err := apiCall(cmd, http.MethodDelete, "/templates/"+url.PathEscape(id), nil); err != nil {
					return fmt.Errorf("%s: %w", id, err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "deleted %s\n", id)
			}
			return nil
		},
	}
}

func newTemplateInspectCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "inspect <template>",
		Short: "Show a template's config and layers as JSON",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var out json.RawMessage
			if err := apiCall(cmd, http.MethodGet, "/templates/"+url.PathEscape(args[0]), &out); err != nil {
				return err
			}
			var pretty bytes.Buffer
			_ = json.Indent(&pretty, out, "", "  ")
			fmt.Fprintln(cmd.OutOrStdout(), pretty.String())
			return nil
		},
	}
}

// templateDirHelp says where the operator commands look without the flag.
const templateDirHelp = "the server's template store (default: the one the server on $AGENTBOX_DATA_DIR, else /var/lib/agentbox, serves from; else <that dir>/templates)"

// templateDirFlag adds the operator commands' --template-dir.
func templateDirFlag(cmd *cobra.Command, dir *string) {
	cmd.Flags().StringVar(dir, "template-dir", "", templateDirHelp)
}

// operatorStore opens the template store on this host: operator commands
// act on every team's templates, so they need root on the server, not an
// API key.
func operatorStore(cmd *cobra.Command, dir string) (*template.Store, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("this is an operator command on the server's template store: run it as root on the server's host")
	}
	dir = templateStoreDir(defaultDataDir(), dir)
	if _, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("--template-dir: %w", err)
	}
	return template.NewStore(dir, slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn})))
}

func newTemplateGCCmd() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "gc",
		Short: "Operator: remove layers no template, snapshot, build in flight or running sandbox uses (every team's)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := operatorStore(cmd, dir)
			if err != nil {
				return err
			}
			res, err := st.GC(cmd.Context())
			if err != nil {
				return err
			}
			u := res.Usage
			fmt.Fprintf(cmd.OutOrStdout(), "removed %d layers, freed %.1f MB\n", len(res.RemovedLayers), float64(res.FreedBytes)/1e6)
			fmt.Fprintf(cmd.OutOrStdout(), "now: %d templates, %d layers using %.1f MB (+ %.1f MB in pre-layer-store template rootfs dirs)\n",
				u.Templates, u.Layers, float64(u.LayerBytes)/1e6, float64(u.TemplateRootfs)/1e6)
			return nil
		},
	}
	templateDirFlag(cmd, &dir)
	return cmd
}

func newTemplateUsageCmd() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "usage",
		Short: "Operator: disk used by the template store, what gc would free, and templates per owner",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := operatorStore(cmd, dir)
			if err != nil {
				return err
			}
			u, err := st.DiskUsage(cmd.Context())
			if err != nil {
				return err
			}
			all, err := st.ListAll(cmd.Context())
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "%d templates, %d layers using %.1f MB; gc would free %d layers, %.1f MB\n",
				u.Templates, u.Layers, float64(u.LayerBytes)/1e6, u.UnusedLayers, float64(u.UnusedBytes)/1e6)
			w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
			fmt.Fprintln(w, "TEMPLATE ID\tALIASES\tOWNER\tVISIBILITY\tSIZE")
			for _, t := range all {
				owner, vis := t.TeamID, "private"
				if owner == "" {
					owner = "(operator)"
				}
				switch {
				case t.Builtin():
					vis = "builtin"
				case t.Public:
					vis = "public"
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%.1f MB\n", t.ID, strings.Join(t.Aliases, ","), owner, vis, float64(t.SizeBytes)/1e6)
			}
			return w.Flush()
		},
	}
	templateDirFlag(cmd, &dir)
	return cmd
}

func newTemplatePublishCmd(public bool) *cobra.Command {
	var dir string
	use, short := "publish <template id>...", "Operator: let every team start sandboxes and builds from these templates (owner keeps tags, builds and deletion)"
	if !public {
		use, short = "unpublish <template id>...", "Operator: make published templates private to their owner again"
	}
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := operatorStore(cmd, dir)
			if err != nil {
				return err
			}
			for _, id := range args {
				t, err := st.SetPublic(cmd.Context(), id, public)
				if err != nil {
					return fmt.Errorf("%s: %w (give the template ID: `agentbox template usage` lists them)", id, err)
				}
				state := "public"
				if !public {
					state = "private to its owner"
				}
				fmt.Fprintf(cmd.OutOrStdout(), "template %s (%s) is %s\n", t.ID, strings.Join(t.Aliases, ","), state)
			}
			return nil
		},
	}
	templateDirFlag(cmd, &dir)
	return cmd
}

// apiCall sends a request to the control plane with the CLI's URL and key
// and decodes a JSON answer into out (nil ignores it).
func apiCall(cmd *cobra.Command, method, path string, out any) error {
	return apiRequest(cmd.Context(), cmd, method, path, nil, out)
}
