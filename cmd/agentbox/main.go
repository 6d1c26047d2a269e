// Command agentbox is the agentbox server (serve) and the command-line
// client of its API: create sandboxes, run commands and shells in them, copy
// files, list and kill them, and build templates.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

func main() {
	err := newRootCmd().Execute()
	if err == nil {
		return
	}
	var exit *exitCodeError
	if errors.As(err, &exit) {
		os.Exit(exit.code)
	}
	fmt.Fprintln(os.Stderr, "agentbox:", err)
	os.Exit(1)
}

// exitCodeError makes the process exit with code without printing anything:
// the sandboxed command already spoke for itself.
type exitCodeError struct{ code int }

func (e *exitCodeError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "agentbox",
		Short: "Sandboxes for AI agents: run code, shells and files in isolated containers",
		Long: `agentbox runs sandboxes for AI agents. "agentbox serve" starts the server;
"agentbox run" confines a local command without a server; the other
commands talk to a server over its E2B-compatible API.

The server is found with --api-url, $AGENTBOX_API_URL or $E2B_API_URL
(default http://127.0.0.1:3000). The API key comes from --api-key,
$AGENTBOX_API_KEY, $E2B_API_KEY, or the file apikey in $AGENTBOX_DATA_DIR
(default /var/lib/agentbox) when it is readable.`,
		Example: `  agentbox run --allow-net proxy.golang.org -- go build ./...
  agentbox create base
  agentbox exec i1a2b3c -- python3 -c 'print(6*7)'
  agentbox shell i1a2b3c`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().String("api-url", "", "API base URL (default $AGENTBOX_API_URL, $E2B_API_URL, http://127.0.0.1:3000)")
	root.PersistentFlags().String("api-key", "", "API key (default $AGENTBOX_API_KEY, $E2B_API_KEY, <data dir>/apikey)")
	root.AddCommand(
		newServeCmd(),
		newAPIKeyCmd(),
		newAuditCmd(),
		newTeamCmd(),
		newCreateCmd(),
		newLsCmd(),
		newInfoCmd(),
		newExecCmd(),
		newShellCmd(),
		newSSHCmd(),
		newCpCmd(),
		newKillCmd(),
		newPortForwardCmd(),
		newTimeoutCmd(),
		newLogsCmd(),
		newEventsCmd(),
		newTemplateCmd(),
		newRunCodeCmd(),
		newRunCmd(),
		newHookCmd(),
		newMCPCmd(),
		newUsageCmd(),
	)
	return root
}
