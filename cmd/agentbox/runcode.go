package main

import (
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	agentbox "github.com/agentbox/agentbox/sdk/go"
)

func newRunCodeCmd() *cobra.Command {
	var (
		lang, contextID, outDir string
		envs                    []string
		timeout                 time.Duration
	)
	cmd := &cobra.Command{
		Use:   "run-code <id> [code | -]",
		Short: "Run code in a sandbox's code interpreter (stateful Python, JavaScript, TypeScript, bash)",
		Long: `Run code in the code interpreter of a sandbox made from an interpreter template
(e.g. code-interpreter-v1). The code comes from the argument, or from stdin
when it is "-" or missing. Contexts keep their state between runs: variables
defined by one run-code are there for the next one in the same context.

stdout and stderr stream as the code runs. Results follow on stdout: the
text of each one, and images (PNG, JPEG, SVG) and PDFs saved to files in
--out-dir whose paths are printed. An error raised by the code is printed
with its traceback and makes the command exit with status 1.`,
		Example: `  echo 'import pandas as pd; pd.DataFrame({"a": [1, 2]}).describe()' | agentbox run-code i1a2b3c -
  agentbox run-code i1a2b3c --lang python - <<'EOF'
  import matplotlib.pyplot as plt
  plt.plot([1, 3, 2]); plt.show()
  EOF
  agentbox run-code i1a2b3c --lang js 'await fetch("http://example.com").then(r => r.status)'
  agentbox run-code i1a2b3c --lang bash 'ls -la | wc -l'`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			env, err := parsePairs("env", envs)
			if err != nil {
				return err
			}
			code := ""
			if len(args) == 2 && args[1] != "-" {
				code = args[1]
			} else {
				b, err := io.ReadAll(cmd.InOrStdin())
				if err != nil {
					return fmt.Errorf("read code from stdin: %w", err)
				}
				code = string(b)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			sbx, err := connect(ctx, cmd, args[0])
			if err != nil {
				return err
			}
			stdout, stderr := cmd.OutOrStdout(), cmd.ErrOrStderr()
			ex, err := sbx.RunCode(ctx, code, agentbox.RunCodeOptions{
				Language: lang, ContextID: contextID, EnvVars: env, Timeout: timeout,
				OnStdout: func(m agentbox.OutputMessage) { _, _ = io.WriteString(stdout, m.Line) },
				OnStderr: func(m agentbox.OutputMessage) { _, _ = io.WriteString(stderr, m.Line) },
			})
			if err != nil {
				if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
					return &exitCodeError{130} // Ctrl-C: the server interrupted the code
				}
				return err
			}
			for i, r := range ex.Results {
				if err := printResult(stdout, r, outDir, fmt.Sprintf("%s-%d-%d", sbx.ID, ex.ExecutionCount, i+1)); err != nil {
					return err
				}
			}
			if ex.Error != nil {
				if tb := strings.TrimSpace(ex.Error.Traceback); tb != "" {
					fmt.Fprintln(stderr, tb)
				}
				fmt.Fprintf(stderr, "%s: %s\n", ex.Error.Name, ex.Error.Value)
				return &exitCodeError{1}
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&lang, "lang", "l", "", "language of the default context to use: python (default), javascript|js, typescript|ts, r, java, bash")
	cmd.Flags().StringVar(&contextID, "context", "", "context id (from the SDK's createCodeContext) instead of a language's default context")
	cmd.Flags().StringArrayVarP(&envs, "env", "e", nil, "KEY=VALUE env var for this run only (repeatable)")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "interrupt the code after this long (the context keeps its state)")
	cmd.Flags().StringVar(&outDir, "out-dir", ".", "directory for images and PDFs the code displays")
	return cmd
}

// printResult prints a result's text and saves its binary formats.
func printResult(w io.Writer, r agentbox.Result, dir, stem string) error {
	files := []struct {
		data   string
		ext    string
		base64 bool
	}{{r.PNG, "png", true}, {r.JPEG, "jpg", true}, {r.PDF, "pdf", true}, {r.SVG, "svg", false}}
	saved := false
	for _, f := range files {
		if f.data == "" {
			continue
		}
		b := []byte(f.data)
		if f.base64 {
			var err error
			if b, err = base64.StdEncoding.DecodeString(strings.TrimSpace(f.data)); err != nil {
				return fmt.Errorf("decode %s result: %w", f.ext, err)
			}
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		p := filepath.Join(dir, stem+"."+f.ext)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return err
		}
		abs, _ := filepath.Abs(p)
		fmt.Fprintf(w, "[%s saved to %s]\n", f.ext, abs)
		saved = true
	}
	// The text of an image is only "<Figure ...>": skip it when saved.
	if r.Text != "" && !saved {
		fmt.Fprintln(w, r.Text)
	} else if r.Text == "" && !saved && r.HTML != "" {
		fmt.Fprintln(w, r.HTML)
	}
	return nil
}
