package main

import (
	"fmt"
	"os"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	"github.com/agentbox/agentbox/internal/mcpserver"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

func newMCPCmd() *cobra.Command {
	var domain string
	cmd := &cobra.Command{
		Use:   "mcp",
		Short: "Serve agentbox's tools to an AI agent over MCP on stdin/stdout",
		Long: `Run a Model Context Protocol server on stdin and stdout, for agents that
spawn their MCP servers (Claude Desktop, Claude Code, IDEs). Its tools create,
list, pause, resume and kill sandboxes, run commands and code, read, write and
list files and expose ports, acting on the server given by --api-url with the
key given by --api-key (or their environment variables), so they see exactly
what that key's team sees. Agents that speak streamable HTTP can instead use
the server's /mcp endpoint with the key in X-API-Key or Authorization: Bearer.`,
		Example: `  claude mcp add agentbox -e AGENTBOX_API_URL=http://127.0.0.1:3000 -e AGENTBOX_API_KEY=e2b_... -- agentbox mcp`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if domain == "" {
				domain = firstNonEmpty(os.Getenv("AGENTBOX_DOMAIN"), os.Getenv("E2B_DOMAIN"))
			}
			c := newClient(cmd, agentbox.WithMessageLimit(mcpserver.MessageLimit))
			srv := mcpserver.New(mcpserver.Config{Client: c, PublicURL: c.APIURL(), Domain: domain})
			if err := srv.Run(cmd.Context(), &mcp.StdioTransport{}); err != nil {
				return fmt.Errorf("mcp over stdio: %w", err)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&domain, "domain", "", "the server's --domain, for the port URLs expose_port returns (default $AGENTBOX_DOMAIN, $E2B_DOMAIN, else localhost with the --api-url port)")
	return cmd
}
