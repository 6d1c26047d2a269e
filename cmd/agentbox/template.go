package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"

	"golang.org/x/sys/unix"

	"github.com/spf13/cobra"

	"github.com/agentbox/agentbox/internal/template"
)

func newTemplateCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "template",
		Short: "List, inspect, remove and garbage-collect templates (server) or build them (locally)",
	}
	cmd.AddCommand(newTemplateLsCmd(), newTemplateBuildCmd(), newTemplateRmCmd(), newTemplateInspectCmd(), newTemplateGCCmd())
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
	var (
		dir, file, tag, network string
		buildArgs               []string
		force                   bool
	)
	builtins := template.BuiltinDefinitions()
	names := slices.Sorted(maps.Keys(builtins))
	cmd := &cobra.Command{
		Use:   "build [name | -f Dockerfile -t name[:tag] <context>]",
		Short: "Build a template on this machine from a builtin definition or a Dockerfile (needs root)",
		Long: fmt.Sprintf(`Build a template into --template-dir, where "agentbox serve" finds it.

Without -f/-t: build a builtin definition (default "base"; known: %s) from
Debian packages with mmdebstrap. A build with the same inputs is skipped.

With -f/-t: build a Dockerfile. FROM names a template or snapshot (ID,
alias or alias:tag), "scratch", or an image: a registry reference,
oci:<layout dir> or docker-archive:<docker save tarball>. Every RUN, COPY
and WORKDIR step becomes a layer cached by its inputs, so an unchanged
rebuild takes no time. RUN steps run in a runc container over the layers,
in the host's network namespace (--network host, the default: this is a
trusted local build) or without network (--network none).`, strings.Join(names, ", ")),
		Example: `  sudo agentbox template build
  sudo agentbox template build browser
  sudo agentbox template build -f Dockerfile -t my-app:v1 .
  sudo agentbox template build -t from-oci:latest -f - . <<< 'FROM oci:/srv/images/app'`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if os.Geteuid() != 0 {
				return fmt.Errorf("building a template needs root (mounts, runc, mmdebstrap)")
			}
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn}))
			store, err := template.NewStore(dir, log)
			if err != nil {
				return err
			}
			if file == "" && tag == "" {
				name := "base"
				if len(args) == 1 {
					name = args[0]
				}
				def, ok := builtins[name]
				if !ok {
					return fmt.Errorf("no builtin template %q (known: %s); to build a Dockerfile use -f and -t", name, strings.Join(names, ", "))
				}
				_, err = store.Build(cmd.Context(), def, cmd.OutOrStdout())
				return err
			}
			if tag == "" {
				return fmt.Errorf("-t name[:tag] is required with -f")
			}
			contextDir := "."
			if len(args) == 1 {
				contextDir = args[0]
			}
			if file == "" {
				file = filepath.Join(contextDir, "Dockerfile")
			}
			var df []byte
			if file == "-" {
				df, err = io.ReadAll(cmd.InOrStdin())
			} else {
				df, err = os.ReadFile(file)
			}
			if err != nil {
				return fmt.Errorf("Dockerfile: %w", err)
			}
			bargs, err := parsePairs("build-arg", buildArgs)
			if err != nil {
				return err
			}
			absCtx, err := filepath.Abs(contextDir)
			if err != nil {
				return err
			}
			spec, err := template.ParseDockerfile(bytes.NewReader(df), absCtx, bargs)
			if err != nil {
				return err
			}
			spec.Name, spec.Tag, _ = strings.Cut(tag, ":")
			spec.Force = force
			spec.Source = "Dockerfile " + file
			switch network {
			case "host":
			case "none":
				spec.Network = func(ctx context.Context, _ string) (string, []string, func(), error) {
					return noNetwork(ctx)
				}
			default:
				return fmt.Errorf("--network %q: want host or none", network)
			}
			t, err := store.BuildFromSpec(cmd.Context(), *spec, cmd.OutOrStdout())
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "template %s (aliases %s, tags %s)\n", t.ID, strings.Join(t.Aliases, ","), strings.Join(t.Tags, ","))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "template-dir", filepath.Join(defaultDataDir(), "templates"), "directory templates are stored in")
	f.StringVarP(&file, "file", "f", "", "Dockerfile to build (\"-\" reads stdin; default <context>/Dockerfile)")
	f.StringVarP(&tag, "tag", "t", "", "template name and optional tag, name[:tag]")
	f.StringArrayVar(&buildArgs, "build-arg", nil, "ARG value, KEY=VALUE (repeatable)")
	f.StringVar(&network, "network", "host", "network of RUN steps: host or none")
	f.BoolVar(&force, "no-cache", false, "rebuild every step")
	return cmd
}

// noNetwork gives RUN steps a fresh network namespace with only loopback.
func noNetwork(ctx context.Context) (string, []string, func(), error) {
	dir, err := os.MkdirTemp("", "agentbox-build-netns-")
	if err != nil {
		return "", nil, nil, err
	}
	p := filepath.Join(dir, "ns")
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		os.RemoveAll(dir)
		return "", nil, nil, err
	}
	// "ip netns" is not needed: unshare makes the namespace and bind-mounts it.
	out, err := exec.CommandContext(ctx, "unshare", "--net="+p, "true").CombinedOutput()
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, nil, fmt.Errorf("new network namespace: %v: %s", err, out)
	}
	return p, nil, func() {
		_ = unix.Unmount(p, unix.MNT_DETACH)
		os.RemoveAll(dir)
	}, nil
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

func newTemplateGCCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "gc",
		Short: "Remove layers no template, snapshot or running sandbox uses; show disk usage",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var res template.GCResult
			if err := apiCall(cmd, http.MethodPost, "/templates/gc", &res); err != nil {
				return err
			}
			u := res.Usage
			fmt.Fprintf(cmd.OutOrStdout(), "removed %d layers, freed %.1f MB\n", len(res.RemovedLayers), float64(res.FreedBytes)/1e6)
			fmt.Fprintf(cmd.OutOrStdout(), "now: %d templates, %d layers using %.1f MB (+ %.1f MB in pre-layer-store template rootfs dirs)\n",
				u.Templates, u.Layers, float64(u.LayerBytes)/1e6, float64(u.TemplateRootfs)/1e6)
			return nil
		},
	}
}

// apiCall sends a request to the control plane with the CLI's URL and key
// and decodes a JSON answer into out (nil ignores it).
func apiCall(cmd *cobra.Command, method, path string, out any) error {
	c := newClient(cmd)
	req, err := http.NewRequestWithContext(cmd.Context(), method, c.APIURL()+path, nil)
	if err != nil {
		return err
	}
	key, _ := cmd.Flags().GetString("api-key")
	for _, k := range []string{key, os.Getenv("AGENTBOX_API_KEY"), os.Getenv("E2B_API_KEY"), localAPIKey()} {
		if k != "" {
			req.Header.Set("X-API-Key", k)
			break
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if resp.StatusCode/100 != 2 {
		var e struct{ Message string }
		if json.Unmarshal(body, &e) == nil && e.Message != "" {
			return fmt.Errorf("%s", e.Message)
		}
		return fmt.Errorf("%s %s: %s", method, path, resp.Status)
	}
	if out != nil && len(body) > 0 {
		return json.Unmarshal(body, out)
	}
	return nil
}
