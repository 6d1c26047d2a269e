package benchmark

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"
)

// coldRows is target 1: cold create → first command p50 per tier against
// `runc run` / `runsc run` of /bin/true on the template's layers, sampled
// alternately, with the server's create step breakdown as a note.
func coldRows(ctx context.Context, a *allRun) []TargetRow {
	var rows []TargetRow
	for _, tier := range []string{"container", "gvisor"} {
		figure := fmt.Sprintf("%s: cold create → first command p50 vs `%s run /bin/true`", tier, tierRuntime(tier))
		if a.layers == nil {
			rows = append(rows, failed(1, figure, errors.New("no template layers for the raw floor (--template-dir)")))
			continue
		}
		before := a.steps(ctx)
		create, floor, errs, err := coldSamples(ctx, a.c, a.cfg.Template, tier, a.layers, a.cfg.Creates, a.log)
		a.stepNote(ctx, tier, before)
		switch {
		case err != nil:
			rows = append(rows, failed(1, figure, err))
			continue
		case len(create) == 0:
			rows = append(rows, failed(1, figure, fmt.Errorf("all %d creates failed", errs)))
			continue
		}
		if tier == "container" {
			a.runc = pct(floor, 50)
		}
		r := atMost(1, fmt.Sprintf("%s (%d samples, %d failed)", figure, len(create), errs), pct(create, 50), pct(floor, 50), 1.2)
		r.Met = r.Met && errs == 0
		rows = append(rows, r)
	}
	return rows
}

// steps scrapes the server's create step histograms ("" metrics: nil).
func (a *allRun) steps(ctx context.Context) stepTotals {
	if a.cfg.MetricsURL == "" {
		return nil
	}
	st, err := scrapeSteps(ctx, a.cfg.MetricsURL, a.cfg.MetricsToken)
	if err != nil {
		a.log.Warn("metrics", "err", err)
	}
	return st
}

// stepNote notes where the milliseconds of the creates since before went.
func (a *allRun) stepNote(ctx context.Context, tier string, before stepTotals) {
	if before == nil {
		return
	}
	after := a.steps(ctx)
	if after == nil {
		return
	}
	line := fmt.Sprintf("(1) %s create steps, mean (the server's step histograms):", tier)
	for _, r := range stepRows(before, after) {
		line += fmt.Sprintf(" %s %s;", trimStep(r.metric), r.value)
	}
	a.note("%s", line)
}

// trimStep is the step's name out of a stepRows metric.
func trimStep(metric string) string {
	const prefix, suffix = "  create step: ", " (mean)"
	if len(metric) > len(prefix)+len(suffix) {
		return metric[len(prefix) : len(metric)-len(suffix)]
	}
	return metric
}

// cpuRows is target 2: host CPU per create → first command → kill against
// `runc run /bin/true`'s, and a burst of cold creates' wall time against
// that CPU for the burst spread over the host's cores; the burst must not
// fail nor leak.
func cpuRows(ctx context.Context, a *allRun) []TargetRow {
	cfg := a.cfg.server()
	const cpuFigure = "host CPU per create → first command → kill (server + children + sandbox cgroup) vs `runc run` CPU"
	burstFigure := fmt.Sprintf("burst of %d cold creates: wall time vs %d × runc CPU ÷ %d cores", cfg.Burst, cfg.Burst, runtime.NumCPU())
	floorCPU, err := runcFloorCPU(ctx, cfg)
	if err != nil {
		return []TargetRow{failed(2, cpuFigure, err), failed(2, burstFigure, err)}
	}
	var rows []TargetRow
	if cpu, err := serverCPUPerCreate(ctx, a.c, cfg, a.cfg.ServerPID); err != nil {
		rows = append(rows, failed(2, cpuFigure, err))
	} else {
		rows = append(rows, atMost(2, cpuFigure, cpu, floorCPU, 1.5))
	}
	res := burst(ctx, a.c, cfg, cfg.Burst, coldMeta("burst"))
	killAll(ctx, a.c, res.ids)
	left := leaks(ctx, a.c, cfg.DataDir, res.ids)
	cpuFloor := time.Duration(cfg.Burst) * floorCPU / time.Duration(runtime.NumCPU())
	r := atMost(2, fmt.Sprintf("%s (%d failed, %d left on the host after kill; p50/p99 %s)", burstFigure, len(res.errs), len(left), pair(pct(res.durs, 50), pct(res.durs, 99))),
		res.total, cpuFloor, 1.5)
	r.Met = r.Met && len(res.errs) == 0 && len(left) == 0
	if len(res.errs) > 0 {
		a.note("(2) first failed create of the cold burst: %s", firstLine(res.errs[0].Error()))
	}
	if len(left) > 0 {
		a.note("(2) left after the cold burst: %s", left[0])
	}
	return append(rows, r)
}

// poolRows is target 3: a burst through the warm pool once its adaptive
// policy sized it (p99 < 1 s; floor: `runc run`, for scale) and single
// claims through the SDKs' create call (p50 < 10 ms; floor: one loopback
// HTTP round trip).
func poolRows(ctx context.Context, a *allRun) []TargetRow {
	cfg := a.cfg.server()
	burstFigure := fmt.Sprintf("warm pool: burst of %d creates, p99", cfg.Burst)
	const claimFigure = "warm pool: single claim, POST /sandboxes p50 vs loopback HTTP"
	var rows []TargetRow
	pb, err := pooledBurst(ctx, a.c, cfg)
	if err != nil {
		return []TargetRow{failed(3, burstFigure, err), failed(3, claimFigure, err)}
	}
	killAll(ctx, a.c, pb.res.ids)
	left := leaks(ctx, a.c, cfg.DataDir, pb.res.ids)
	if len(pb.res.durs) == 0 {
		rows = append(rows, failed(3, burstFigure, fmt.Errorf("all %d creates failed: %w", len(pb.res.errs), pb.res.errs[0])))
	} else {
		fig := fmt.Sprintf("%s vs `runc run` (pool %d/%d after a first burst, refilled in %s; %d warm claims, %d failed, %d left after kill)",
			burstFigure, pb.ready, pb.target, round(pb.refill), pb.hits, len(pb.res.errs), len(left))
		r := below(3, fig, pct(pb.res.durs, 99), a.runc, time.Second)
		r.Met = r.Met && len(pb.res.errs) == 0 && len(left) == 0
		if a.runc == 0 {
			r.Err = "no `runc run` floor (target 1 failed)"
		}
		rows = append(rows, r)
	}
	httpFloor, err := loopbackFloor(ctx, cfg.Commands)
	if err != nil {
		return append(rows, failed(3, claimFigure, err))
	}
	claims, errs := warmClaims(ctx, a.c, cfg)
	if len(claims) == 0 {
		return append(rows, failed(3, claimFigure, fmt.Errorf("all %d claims failed", errs)))
	}
	r := below(3, fmt.Sprintf("%s (%d samples, %d failed)", claimFigure, len(claims), errs), pct(claims, 50), pct(httpFloor, 50), 10*time.Millisecond)
	r.Met = r.Met && errs == 0
	return append(rows, r)
}
