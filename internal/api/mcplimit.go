package api

import (
	"fmt"
	"net/http"
	"sync"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/httperr"
)

// MCPCallsPerTeam is the default of how many MCP requests one team may
// have under way at once (--mcp-calls-per-team). Over stateless HTTP each
// request carries one tool call, and a tool call holds the server's
// memory and a sandbox's attention until it ends.
const MCPCallsPerTeam = 16

// teamCalls counts the requests under way per team and refuses one past
// the team's limit, so that one team's calls never take another's turn.
type teamCalls struct {
	mu      sync.Mutex
	perTeam int // 0: MCPCallsPerTeam
	running map[string]int
}

// SetMCPCallsPerTeam sets how many MCP requests a team may have under way
// at once; call before serving.
func (s *Server) SetMCPCallsPerTeam(n int) { s.mcpCalls.perTeam = n }

func (c *teamCalls) acquire(team string) (int, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	limit := c.perTeam
	if limit <= 0 {
		limit = MCPCallsPerTeam
	}
	if c.running == nil {
		c.running = map[string]int{}
	}
	if c.running[team] >= limit {
		return limit, false
	}
	c.running[team]++
	return limit, true
}

func (c *teamCalls) release(team string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.running[team]--; c.running[team] <= 0 {
		delete(c.running, team)
	}
}

// limit wraps next, which runs behind the API key check, with the team's
// limit of requests under way.
func (c *teamCalls) limit(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		team := keyOf(r.Context()).TeamID
		limit, ok := c.acquire(team)
		if !ok {
			httperr.Write(w, fmt.Errorf("MCP: the team has %d calls under way, the most this server allows at once (agentbox serve --mcp-calls-per-team); retry when one ends: %w",
				limit, errdefs.ErrResourceExhausted))
			return
		}
		defer c.release(team)
		next.ServeHTTP(w, r)
	})
}
