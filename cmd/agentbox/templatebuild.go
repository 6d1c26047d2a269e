package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentbox/agentbox/api/gen/rest"
	"github.com/agentbox/agentbox/internal/template"
)

func newTemplateBuildCmd() *cobra.Command {
	var (
		dir, file, tag string
		buildArgs      []string
		force          bool
	)
	builtins := template.BuiltinDefinitions()
	names := slices.Sorted(maps.Keys(builtins))
	cmd := &cobra.Command{
		Use:   "build [name | -f Dockerfile -t name[:tag] <context>]",
		Short: "Build a Dockerfile into a template of your team (through the server), or a builtin (operator, on the server's host)",
		Long: fmt.Sprintf(`With -f/-t: build a Dockerfile through the server's build API, as a template
of the API key's team. The CLI uploads the COPY sources from <context>
(filtered by its .dockerignore); the server runs every RUN step as a sandbox
of the team (same runtime, hardening, network policy and quota as any of its
sandboxes) and writes COPY and WORKDIR layers. FROM names a template the
team may use (its own, a builtin, a public one: ID, alias or alias:tag),
"scratch", or a registry image. Every RUN, COPY and WORKDIR step becomes a
layer cached by its inputs, per team, so an unchanged rebuild takes no time.
The names of the builtins are reserved.

Without -f/-t: build a builtin definition (default "base"; known: %s)
into --template-dir from Debian packages with mmdebstrap (operator input,
needs root on the server's host). A build with the same inputs is skipped.`, strings.Join(names, ", ")),
		Example: `  agentbox template build -f Dockerfile -t my-app:v1 .
  sudo agentbox template build
  sudo agentbox template build browser`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if file == "" && tag == "" {
				name := "base"
				if len(args) == 1 {
					name = args[0]
				}
				def, ok := builtins[name]
				if !ok {
					return fmt.Errorf("no builtin template %q (known: %s); to build a Dockerfile use -f and -t", name, strings.Join(names, ", "))
				}
				if os.Geteuid() != 0 {
					return fmt.Errorf("building a builtin template needs root on the server's host (mounts, mmdebstrap)")
				}
				log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn}))
				store, err := template.NewStore(templateStoreDir(defaultDataDir(), dir), log)
				if err != nil {
					return err
				}
				if msg := buildEstimate(cmd.Context(), store, def); msg != "" {
					fmt.Fprintln(cmd.OutOrStdout(), msg)
				}
				_, err = store.Build(cmd.Context(), def, template.OperatorRunner{}, cmd.OutOrStdout())
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
			var err error
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
			spec.Force = force
			return remoteBuild(cmd, *spec, tag)
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "template-dir", "", templateDirHelp+" (builtin builds only)")
	f.StringVarP(&file, "file", "f", "", "Dockerfile to build (\"-\" reads stdin; default <context>/Dockerfile)")
	f.StringVarP(&tag, "tag", "t", "", "template name and optional tag, name[:tag]")
	f.StringArrayVar(&buildArgs, "build-arg", nil, "ARG value, KEY=VALUE (repeatable)")
	f.BoolVar(&force, "no-cache", false, "rebuild every step")
	return cmd
}

// remoteBuild builds spec through the server's build API: the same path as
// the E2B SDK's Template.build(), so RUN steps run as sandboxes of the team.
func remoteBuild(cmd *cobra.Command, spec template.BuildSpec, ref string) error {
	ctx := cmd.Context()
	out := cmd.OutOrStdout()
	// Steps run as root until a USER step, as in Docker, whatever the
	// base's default user: each RUN names its user.
	user := "root"
	var steps []rest.TemplateStep
	var uploads []template.Step
	for _, st := range spec.Steps {
		switch st.Op {
		case template.OpRun:
			u := st.User
			if u == "" {
				u = user
			}
			steps = append(steps, rest.TemplateStep{Type: "RUN", Args: []string{st.ShellCommand(), u}, Force: st.Force})
		case template.OpUser:
			user = st.Args[0]
			steps = append(steps, rest.TemplateStep{Type: "USER", Args: st.Args})
		case template.OpCopy:
			for _, src := range st.Src {
				one := st
				one.Src = []string{src}
				dest := st.Dest
				if len(st.Src) > 1 && !strings.HasSuffix(dest, "/") {
					dest += "/"
				}
				steps = append(steps, rest.TemplateStep{Type: "COPY", Args: []string{src, dest, st.User, st.Mode}, Force: st.Force})
				uploads = append(uploads, one)
			}
		case template.OpCmd, template.OpEntrypoint:
			steps = append(steps, rest.TemplateStep{Type: st.Op, Args: st.Argv()})
		default: // ENV, WORKDIR, EXPOSE, READY
			steps = append(steps, rest.TemplateStep{Type: st.Op, Args: st.Args})
		}
	}
	name, tagName, _ := strings.Cut(ref, ":")
	var req rest.TemplateRequestResponseV3
	if err := apiJSON(cmd, http.MethodPost, "/v3/templates", rest.TemplateBuildRequestV3{Name: ref}, &req); err != nil {
		return fmt.Errorf("request build: %w", err)
	}
	fmt.Fprintf(out, "build %s of template %s (%s)\n", req.BuildID, ref, req.TemplateID)
	// Upload each COPY's sources; the files hash is the SHA-256 of the
	// archive, which the server checks (?verify=sha256).
	j := 0
	for i := range steps {
		if steps[i].Type != "COPY" {
			continue
		}
		var buf bytes.Buffer
		if err := template.WriteContextArchive(uploads[j], &buf); err != nil {
			return err
		}
		j++
		sum := sha256.Sum256(buf.Bytes())
		hash := hex.EncodeToString(sum[:])
		steps[i].FilesHash = hash
		var link rest.TemplateBuildFileUpload
		path := "/templates/" + url.PathEscape(req.TemplateID) + "/files/" + hash + "?verify=sha256"
		if err := apiJSON(cmd, http.MethodGet, path, nil, &link); err != nil {
			return fmt.Errorf("upload link for COPY %s: %w", steps[i].Args[0], err)
		}
		if link.Present {
			continue
		}
		put, err := http.NewRequestWithContext(ctx, http.MethodPut, link.URL, bytes.NewReader(buf.Bytes()))
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(put)
		if err != nil {
			return fmt.Errorf("upload COPY %s: %w", steps[i].Args[0], err)
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			return fmt.Errorf("upload COPY %s: %s: %s", steps[i].Args[0], resp.Status, body)
		}
		fmt.Fprintf(out, "uploaded %s (%d bytes)\n", steps[i].Args[0], buf.Len())
	}
	from := spec.From
	if from == "" {
		from = "scratch"
	}
	start := rest.TemplateBuildStartV2{FromTemplate: from, Force: spec.Force, Steps: steps, StartCmd: spec.StartCmd, ReadyCmd: spec.ReadyCmd}
	base := "/templates/" + url.PathEscape(req.TemplateID) + "/builds/" + url.PathEscape(req.BuildID)
	if err := apiJSON(cmd, http.MethodPost, "/v2"+base, start, nil); err != nil {
		return fmt.Errorf("start build: %w", err)
	}
	offset := 0
	for {
		var st rest.TemplateBuildInfo
		if err := apiJSON(cmd, http.MethodGet, fmt.Sprintf("%s/status?logsOffset=%d", base, offset), nil, &st); err != nil {
			return fmt.Errorf("build status: %w", err)
		}
		for _, e := range st.LogEntries {
			fmt.Fprintln(out, e.Message)
		}
		offset += len(st.LogEntries)
		switch st.Status {
		case template.StatusReady:
			fmt.Fprintf(out, "template %s (name %s, tag %s)\n", req.TemplateID, name, cmpOr(tagName, "default"))
			return nil
		case template.StatusError:
			msg := "build failed"
			if st.Reason != nil {
				msg = st.Reason.Message
			}
			return fmt.Errorf("%s", msg)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(300 * time.Millisecond):
		}
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// apiJSON sends a JSON request to the control plane with the CLI's URL and
// key and decodes a JSON answer into out (nil ignores it).
func apiJSON(cmd *cobra.Command, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	return apiRequest(cmd.Context(), cmd, method, path, rd, out)
}

func apiRequest(ctx context.Context, cmd *cobra.Command, method, path string, body io.Reader, out any) error {
	c := newClient(cmd)
	req, err := http.NewRequestWithContext(ctx, method, c.APIURL()+path, body)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
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
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if resp.StatusCode/100 != 2 {
		var e struct{ Message string }
		if json.Unmarshal(b, &e) == nil && e.Message != "" {
			return fmt.Errorf("%s", e.Message)
		}
		return fmt.Errorf("%s %s: %s", method, path, resp.Status)
	}
	if out != nil && len(b) > 0 {
		return json.Unmarshal(b, out)
	}
	return nil
}

// builtinBuildTime is a builtin's first-build time on a 2-core host with a
// fast mirror (the README's figures), for the message before a build.
func builtinBuildTime(name string) string {
	switch name {
	case "base":
		return "about 1-2 minutes"
	case "code-interpreter-v1":
		return "2-4 minutes, a 1.5 GB layer over base"
	case "browser":
		return "about a minute, a 0.7 GB layer over base"
	case "desktop":
		return "2-3 minutes, a 1.0 GB layer over base"
	}
	return "several minutes"
}

// buildEstimate says where a builtin build goes and how long it will take
// when it is not cached yet, counting a missing base; "" when it is cached.
func buildEstimate(ctx context.Context, store *template.Store, def template.Definition) string {
	cached := func(d template.Definition) bool {
		id, err := d.ID()
		if err != nil {
			return false
		}
		_, err = store.Get(ctx, "", id)
		return err == nil
	}
	if cached(def) {
		return ""
	}
	msg := fmt.Sprintf("Building %s into %s (first build only: %s", def.Name, store.Dir(), builtinBuildTime(def.Name))
	if def.Base != nil && !cached(*def.Base) {
		msg += fmt.Sprintf("; %s first, %s", def.Base.Name, builtinBuildTime(def.Base.Name))
	}
	return msg + ")..."
}
