package benchmark

import (
	"context"
	"fmt"
	"slices"
)

// lifecycleRows is target 6: pause and resume of a sandbox whose process
// holds each size against raw `criu dump` / `criu restore -d` of a process
// holding the same memory, and for the largest size the first command of
// a lazy resume, which must come before all its memory is in.
func lifecycleRows(ctx context.Context, a *allRun) []TargetRow {
	cfg := a.cfg.lifecycle()
	var rows []TargetRow
	for _, mb := range cfg.SizesMB {
		pauseFig := fmt.Sprintf("pause, %d MB resident: p50 vs raw criu dump", mb)
		resumeFig := fmt.Sprintf("resume, %d MB resident: p50 vs raw criu restore", mb)
		a.log.Info("lifecycle", "size MB", mb)
		dump, restore, ferr := criuFloor(ctx, cfg, mb)
		if ferr != nil {
			rows = append(rows, failed(6, pauseFig, fmt.Errorf("raw criu: %w", ferr)), failed(6, resumeFig, fmt.Errorf("raw criu: %w", ferr)))
			continue
		}
		pause, resume, first, _, _, _, err := pauseResume(ctx, a.c, cfg, mb)
		if err != nil {
			rows = append(rows, failed(6, pauseFig, err), failed(6, resumeFig, err))
			continue
		}
		rows = append(rows,
			atMost(6, fmt.Sprintf("%s (%d cycles)", pauseFig, len(pause)), pct(pause, 50), pct(dump, 50), 1.3),
			atMost(6, fmt.Sprintf("%s (%d cycles; first command answered after %s)", resumeFig, len(resume), round(pct(first, 50))), pct(resume, 50), pct(restore, 50), 1.3))
	}
	mb := slices.Max(cfg.SizesMB)
	rows = append(rows, lazyRow(ctx, a, cfg, mb))
	return rows
}

// lazyRow resumes a sandbox holding mb lazily (agentbox.lazyResume on):
// resume call → first command answered, held to raw `criu restore` of the
// same memory for scale; met when the command is answered before all of
// the memory is in (the page daemon gone).
func lazyRow(ctx context.Context, a *allRun, cfg LifecycleConfig, mb int) TargetRow {
	figure := fmt.Sprintf("lazy resume, %d MB resident: call → first command p50 vs raw criu restore", mb)
	_, restore, err := criuFloor(ctx, cfg, mb)
	if err != nil {
		return failed(6, figure, fmt.Errorf("raw criu: %w", err))
	}
	first, all, err := lazyResumes(ctx, a.c, cfg, mb, "on")
	if err != nil {
		return failed(6, figure, err)
	}
	f50, all50 := pct(first, 50), pct(all, 50)
	r := atMost(6, fmt.Sprintf("%s (all memory in after %s)", figure, round(all50)), f50, pct(restore, 50), 1)
	r.Goal = "answers before all memory is in"
	r.Met = f50 < all50
	return r
}

// forkRows is target 7: fork ×Forks of a running sandbox, call until every
// copy runs, against one restore of the same sandbox (≤ 2×).
func forkRows(ctx context.Context, a *allRun) []TargetRow {
	cfg := a.cfg.lifecycle()
	figure := fmt.Sprintf("fork ×%d of a running sandbox vs one restore of it", cfg.Forks)
	restore, fork, ok, err := forkVsRestore(ctx, a.c, cfg)
	if err != nil {
		return []TargetRow{failed(7, figure, err)}
	}
	r := atMost(7, fmt.Sprintf("%s (%d copies answered a command)", figure, ok), fork, restore, 2)
	r.Met = r.Met && ok == cfg.Forks
	return []TargetRow{r}
}
