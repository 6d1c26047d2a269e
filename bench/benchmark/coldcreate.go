package benchmark

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/agentbox/agentbox/e2e/wire"
)

// createFirstCommand times one create → `echo ok` answered, and kills the
// sandbox.
func createFirstCommand(ctx context.Context, c *wire.Client, template string, md map[string]string) (time.Duration, error) {
	start := time.Now()
	sb, err := c.Create(ctx, wire.CreateRequest{TemplateID: template, Timeout: 600, Metadata: md})
	if err != nil {
		return 0, err
	}
	defer func() { _ = c.Kill(context.WithoutCancel(ctx), sb.SandboxID) }()
	r, err := c.Run(ctx, sb, "", "echo ok")
	if err == nil && r.Stdout != "ok\n" {
		err = fmt.Errorf("echo ok printed %q", r.Stdout)
	}
	if err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// tierRuntime is the raw runtime a tier's cold create is held to.
func tierRuntime(tier string) string {
	if tier == "gvisor" {
		return "runsc"
	}
	return "runc"
}

// coldSamples times n cold creates → first command of tier and n raw
// `<runtime> run /bin/true` on the template's layers, alternately, so that
// both see the same load on a shared host. A failed create is counted in
// errs; a failed floor run ends the samples.
func coldSamples(ctx context.Context, c *wire.Client, template, tier string, layers []string, n int, log *slog.Logger) (create, floor []time.Duration, errs int, err error) {
	md := map[string]string{"agentbox.isolation": tier, "bench": "cold-" + tier}
	for i := range n {
		log.Info("cold create", "tier", tier, "sample", i+1)
		if d, err := createFirstCommand(ctx, c, template, md); err != nil {
			errs++
			log.Warn("create", "tier", tier, "err", err)
		} else {
			create = append(create, d)
		}
		f, err := rawFloor(ctx, tierRuntime(tier), layers, 1)
		if err != nil {
			return create, floor, errs, fmt.Errorf("%s run: %w", tierRuntime(tier), err)
		}
		floor = append(floor, f...)
	}
	return create, floor, errs, nil
}
