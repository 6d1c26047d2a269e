// Package mcp_test drives agentbox's MCP server end to end with the official
// MCP TypeScript SDK (@modelcontextprotocol/sdk): streamable HTTP at /mcp of
// the real `agentbox serve`, authenticated by API keys of two teams, and
// stdio through a spawned `agentbox mcp`.
package mcp_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
)

var suite = harness.NewSuite("mcp")

func TestMain(m *testing.M) { os.Exit(suite.Run(m)) }

// TestMCPClient runs mcp.test.mjs.
func TestMCPClient(t *testing.T) {
	s := suite.Server(t)
	other := s.NewKey(t, "mcp-other")
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Minute)
	defer cancel()
	dir := filepath.Join(s.Root, "e2e", "mcp")
	harness.NPMInstall(t, dir)
	cmd := exec.CommandContext(ctx, "node", "--test", "--test-concurrency=1", "--test-reporter=spec", "mcp.test.mjs")
	cmd.Dir = dir
	cmd.Env = append(s.Env(s.APIKey), "E2E_OTHER_API_KEY="+other, "AGENTBOX_BIN="+s.Bin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node --test failed: %v\n%s", err, out)
	}
	t.Logf("node --test:\n%s", out)
}
