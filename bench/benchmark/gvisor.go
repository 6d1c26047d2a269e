package benchmark

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"text/tabwriter"

	"github.com/agentbox/agentbox/e2e/wire"
)

// GVisorConfig configures RunGVisor.
type GVisorConfig struct {
	APIURL, APIKey string
	Template       string
	TemplateDir    string // the server's template store, for the raw `runsc run` floor
	Creates        int    // samples of each side
	// MetricsURL and MetricsToken read the server's step histograms for
	// the breakdown ("" skips it).
	MetricsURL, MetricsToken string
}

// RunGVisor measures gVisor-tier create → first command against `runsc
// run /bin/true` on the same template layers in the same run (issue 14,
// target 1), sampled alternately, with the mean time of each create step
// of the gVisor creates (the server's step histograms, scraped around
// them: run it on a server with no other traffic).
func RunGVisor(ctx context.Context, cfg GVisorConfig, w io.Writer, log *slog.Logger) error {
	if cfg.Template == "" {
		cfg.Template = "base"
	}
	if cfg.Creates <= 0 {
		cfg.Creates = 10
	}
	c := wire.New(cfg.APIURL, cfg.APIKey)
	if err := c.Health(ctx); err != nil {
		return fmt.Errorf("server at %s: %w", cfg.APIURL, err)
	}
	layers, err := templateLayers(ctx, cfg.TemplateDir, cfg.Template)
	if err != nil {
		return fmt.Errorf("raw floor: %w", err)
	}
	var before stepTotals
	if cfg.MetricsURL != "" {
		if before, err = scrapeSteps(ctx, cfg.MetricsURL, cfg.MetricsToken); err != nil {
			log.Warn("metrics", "err", err)
		}
	}
	create, floor, errs, err := coldSamples(ctx, c, cfg.Template, "gvisor", layers, cfg.Creates, log)
	if err != nil {
		return err
	}
	var after stepTotals
	if before != nil {
		if after, err = scrapeSteps(ctx, cfg.MetricsURL, cfg.MetricsToken); err != nil {
			log.Warn("metrics", "err", err)
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "METRIC\tAGENTBOX\tFLOOR\tRATIO")
	fp50 := pct(floor, 50)
	fmt.Fprintf(tw, "floor: runsc run /bin/true on the template's layers (p50/p95)\t%s\t\t\n", pair(fp50, pct(floor, 95)))
	if len(create) == 0 {
		fmt.Fprintf(tw, "gvisor create → first command\tall %d failed\t\t\n", errs)
	} else {
		fmt.Fprintf(tw, "gvisor create → first command (p50/p95, %d errors; target ≤1.2x)\t%s\t%s\t%s\n", errs, pair(pct(create, 50), pct(create, 95)), round(fp50), ratio(pct(create, 50), fp50))
	}
	if after != nil {
		for _, r := range stepRows(before, after) {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.metric, r.value, r.floor, r.ratio)
		}
	}
	return tw.Flush()
}
