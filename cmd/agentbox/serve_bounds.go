package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/spf13/pflag"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/gateway"
	"github.com/agentbox/agentbox/internal/template"
)

// boundsFlags are the per-team bounds of what a tenant can leave on the
// server through the API: uploads, upload links, cached idempotency keys
// and MCP calls under way; and what the gateway holds open per client
// address and per sandbox.
type boundsFlags struct {
	UploadTeamMB    int
	UploadTTL       time.Duration
	UploadLinks     int
	IdempotencyKeys int
	MCPCallsPerTeam int
	GatewayClient   int
	GatewaySandbox  int
	BuildRequests   int
}

func addBoundsFlags(f *pflag.FlagSet, b *boundsFlags) {
	f.IntVar(&b.UploadTeamMB, "upload-team-max-size", template.DefaultUploadTeamMB, "most MiB one team's template build uploads (COPY contexts), stored and being received, may add up to; an upload past it is refused with 429")
	f.DurationVar(&b.UploadTTL, "upload-ttl", template.DefaultUploadTTL, "an upload no build has used, and no client asked for, for this long is removed (checked every ttl/2, at most every 5 minutes)")
	f.IntVar(&b.UploadLinks, "upload-links-per-team", api.UploadLinksPerTeam, "most unused upload links one team may hold at once (each expires an hour after it was made)")
	f.IntVar(&b.IdempotencyKeys, "idempotency-keys-per-team", api.IdempotencyKeysPerTeam, "most Idempotency-Key answers remembered per team; past it the team's own oldest are forgotten, never another team's")
	f.IntVar(&b.GatewayClient, "gateway-max-per-client", gateway.DefaultMaxPerClient, "most sandbox requests, streams and tunnels one client address (IPv4 address or IPv6 /64; see --trusted-proxy) may have open through the gateway at once; more are refused with 429")
	f.IntVar(&b.GatewaySandbox, "gateway-max-per-sandbox", gateway.DefaultMaxPerSandbox, "most requests, streams and tunnels the gateway holds open to one sandbox at once; more are refused with 503")
	f.IntVar(&b.BuildRequests, "build-requests-per-team", template.WaitingBuildsPerTeam, "most requested template builds one team may leave unstarted at once (an unstarted one expires after an hour); more are refused with 429")
	f.IntVar(&b.MCPCallsPerTeam, "mcp-calls-per-team", api.MCPCallsPerTeam, "most MCP requests (tool calls) one team may have under way at once on /mcp; more are refused with 429")
}

// applyBounds hands the bounds to the API, the template store and the
// gateway.
func applyBounds(b boundsFlags, apiSrv *api.Server, templates *template.Store, gw *gateway.Gateway) {
	gw.SetLimits(gateway.Limits{PerClient: b.GatewayClient, PerSandbox: b.GatewaySandbox})
	templates.SetUploadLimits(template.UploadLimits{TeamBytes: int64(b.UploadTeamMB) << 20, TTL: b.UploadTTL})
	apiSrv.SetUploadLinksPerTeam(b.UploadLinks)
	apiSrv.SetIdempotencyKeysPerTeam(b.IdempotencyKeys)
	apiSrv.SetMCPCallsPerTeam(b.MCPCallsPerTeam)
}

// sweepUploads removes expired uploads until ctx ends.
func sweepUploads(ctx context.Context, templates *template.Store, ttl time.Duration, log *slog.Logger) {
	if ttl <= 0 {
		ttl = template.DefaultUploadTTL
	}
	every := min(max(ttl/2, time.Second), 5*time.Minute)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if _, err := templates.SweepUploads(now); err != nil {
				log.Warn("sweep uploads", "err", err)
			}
		}
	}
}
