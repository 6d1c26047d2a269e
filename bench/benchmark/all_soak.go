package benchmark

import (
	"context"
	"fmt"
	"os"
	"time"
)

// soakRows runs the soak (soak.go) with the server's warm pool and one
// team, printing its samples to stderr as it goes, and reports whether the
// host objects came back to their baseline once the workload's objects
// were gone, and how far RSS, open files and goroutines moved.
func soakRows(ctx context.Context, a *allRun) []TargetRow {
	ops := a.cfg.SoakOps
	if ops == 0 {
		ops = 2000
	}
	if ops < 0 {
		return nil
	}
	scope := HostScope{ServerPID: a.cfg.ServerPID, DataDir: a.cfg.DataDir, Instance: a.cfg.Instance, Bridge: a.cfg.Bridge,
		MetricsURL: a.cfg.MetricsURL, MetricsToken: a.cfg.MetricsToken}
	// The warm pool's members are host objects too: the baseline and the
	// comparison are taken with the pool full at its target, never while a
	// refill is half made (a member counted with its netns, not yet its veth).
	settle := func() *poolStats {
		p, _ := waitPool(ctx, a.cfg.server(), time.Minute)
		return p
	}
	before := settle()
	start := time.Now()
	res, err := Soak(ctx, SoakConfig{APIURL: a.cfg.APIURL, Keys: []string{a.cfg.APIKey}, Template: a.cfg.Template, Ops: ops, Workers: 2, Host: scope}, os.Stderr)
	row := TargetRow{Target: 0, Figure: fmt.Sprintf("soak: host objects after %d mixed operations", ops), Goal: "back to baseline"}
	if err != nil {
		row.Err = err.Error()
		return []TargetRow{row}
	}
	// Kills finish their host cleanup shortly after they answer.
	after := res.After
	var now *poolStats
	for deadline := time.Now().Add(2 * time.Minute); after.Objects() != res.Baseline.Objects() && time.Now().Before(deadline); {
		time.Sleep(time.Second)
		now = settle()
		after = scope.Sample()
	}
	b := res.Baseline
	row.Value = fmt.Sprintf("mounts %d, netns %d, veths %d, loops %d, cgroups %d", after.Mounts, after.Netns, after.Veths, after.Loops, after.Cgroups)
	if before != nil && now != nil && now.Target != before.Target {
		// An adaptive pool sized by the soak's own creates holds more (or
		// fewer) members than at the baseline: say so next to the counts.
		row.Value += fmt.Sprintf(" (warm pool %d members, %d at the baseline)", now.Ready, before.Ready)
	}
	row.Floor = fmt.Sprintf("mounts %d, netns %d, veths %d, loops %d, cgroups %d", b.Mounts, b.Netns, b.Veths, b.Loops, b.Cgroups)
	row.Met = after.Objects() == b.Objects()
	failed := 0
	for _, n := range res.Failed {
		failed += n
	}
	a.note("soak: %d operations in %s, %d failed %v; RSS %d → %d MiB, goroutines %d → %d, open files %d → %d, database %d → %d KiB",
		res.Ops, time.Since(start).Round(time.Second), failed, res.FirstErr, b.RSSMiB, after.RSSMiB, b.Goroutines, after.Goroutines, b.FDs, after.FDs, b.DBKiB, after.DBKiB)
	return []TargetRow{row}
}
