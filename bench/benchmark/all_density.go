package benchmark

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/agentbox/agentbox/e2e/wire"
)

// issueDensity is how many idle sandboxes issue 14 holds at once (1,000
// container and 300 gVisor): the memory budget of one is BudgetGiB over it.
const issueDensity = 1300

// densityRows is target 8, measured not extrapolated: DensityContainer
// container-tier and DensityGVisor gVisor sandboxes held at once, each
// answering a command, the host memory each costs against its share of
// the issue's budget, then all killed and the host checked for anything
// left (netns, veths, runtime state, cgroups and their processes, mounts,
// data-dir entries, nftables elements).
func densityRows(ctx context.Context, a *allRun) []TargetRow {
	tiers := []struct {
		name string
		n    int
	}{{"container", a.cfg.DensityContainer}, {"gvisor", a.cfg.DensityGVisor}}
	heldFig := func(tier string, n int) string {
		return fmt.Sprintf("%s: %d idle sandboxes at once, each answering a command, then all killed", tier, n)
	}
	memFig := func(tier string) string {
		return fmt.Sprintf("%s: host memory per idle sandbox vs %.0f GiB ÷ %d", tier, a.cfg.BudgetGiB, issueDensity)
	}
	dcfg := DensityConfig{APIURL: a.cfg.APIURL, APIKey: a.cfg.APIKey, Template: a.cfg.Template, Parallel: a.cfg.Parallel,
		DataDir: a.cfg.DataDir, Instance: a.cfg.Instance, Bridge: a.cfg.Bridge, ServerPID: a.cfg.ServerPID, MinFreeMiB: a.cfg.MinFreeMiB}
	if dcfg.Instance == "" || dcfg.DataDir == "" {
		err := errors.New("the server's --instance and --data-dir are needed to check what is left")
		var rows []TargetRow
		for _, t := range tiers {
			if t.n > 0 {
				rows = append(rows, failed(8, heldFig(t.name, t.n), err), failed(8, memFig(t.name), err))
			}
		}
		return rows
	}

	before := hostState(dcfg)
	rssBefore := rssKB(a.cfg.ServerPID)
	dropCaches()
	mem := memInfo("MemAvailable")
	type held struct {
		sbs      []*wire.Sandbox
		createEr error
		perMiB   float64
		answered int
		cmdErr   error
	}
	got := make([]held, len(tiers))
	var all []*wire.Sandbox
	start := time.Now()
	for i, t := range tiers {
		if t.n <= 0 {
			continue
		}
		got[i].sbs, got[i].createEr = createIdle(ctx, a.c, dcfg, t.name, t.n, a.log)
		all = append(all, got[i].sbs...)
		time.Sleep(5 * time.Second) // let envd settle
		dropCaches()
		now := memInfo("MemAvailable")
		if len(got[i].sbs) > 0 && mem > now {
			got[i].perMiB = float64(mem-now) / float64(len(got[i].sbs)) / (1 << 20)
		}
		mem = now
		// Other work on a shared host moves MemAvailable too: the memory
		// charged to the sandboxes' cgroups is the lower bound.
		got[i].perMiB = max(got[i].perMiB, cgroupMeanMiB(a.cfg.DataDir, got[i].sbs))
	}
	a.note("(8) %d sandboxes created in %s, %d in flight", len(all), time.Since(start).Round(time.Second), a.cfg.Parallel)
	rssHeld := rssKB(a.cfg.ServerPID)
	if len(all) > 0 && a.cfg.ServerPID > 0 {
		a.note("(8) server RSS %.1f MiB → %.1f MiB holding %d sandboxes (%.1f KiB each)",
			float64(rssBefore)/1024, float64(rssHeld)/1024, len(all), float64(rssHeld-rssBefore)/float64(len(all)))
	}
	for i := range tiers {
		got[i].answered, got[i].cmdErr = answerAll(ctx, a.c, got[i].sbs, a.cfg.Parallel)
	}
	start = time.Now()
	killErrs := killEach(ctx, a.c, all, a.cfg.Parallel, a.log)
	left := leftBehind(before, waitClean(dcfg, before, 2*time.Minute))
	a.note("(8) killed all in %s, %d kill errors; left on the host: %s", time.Since(start).Round(time.Second), killErrs, orNothing(left))

	var rows []TargetRow
	budget := a.cfg.BudgetGiB * 1024 / issueDensity
	for i, t := range tiers {
		if t.n <= 0 {
			continue
		}
		g := got[i]
		if g.createEr != nil {
			a.note("(8) %s: what ran out (first failed create): %s", t.name, cause(g.createEr))
		}
		if g.cmdErr != nil {
			a.note("(8) %s: first failed command: %s", t.name, cause(g.cmdErr))
		}
		r := TargetRow{Target: 8, Figure: heldFig(t.name, t.n),
			Value: fmt.Sprintf("%d held, %d answered, %d objects left", len(g.sbs), g.answered, len(left)),
			Floor: fmt.Sprintf("%d asked", t.n), Ratio: float64(g.answered) / float64(t.n), Goal: "all, nothing left"}
		r.Met = g.answered == t.n && len(left) == 0 && killErrs == 0
		if len(g.sbs) == 0 {
			r.Err = "no sandbox created"
			if g.createEr != nil {
				r.Err += ": " + firstLine(g.createEr.Error())
			}
		}
		rows = append(rows, r)
		m := TargetRow{Target: 8, Figure: memFig(t.name), Value: fmt.Sprintf("%.1f MiB", g.perMiB), Floor: fmt.Sprintf("%.1f MiB", budget),
			Ratio: g.perMiB / budget, Goal: "≤ 1x"}
		m.Met = m.Ratio <= 1
		if len(g.sbs) == 0 || g.perMiB <= 0 {
			m.Err = "no memory measured (no sandbox held, no cgroup found, and other work freed memory meanwhile)"
		}
		rows = append(rows, m)
	}
	return rows
}

func orNothing(s []string) string {
	if len(s) == 0 {
		return "nothing"
	}
	return strings.Join(s, ", ")
}

// cgroupMeanMiB is the mean memory charged to the sandboxes' cgroups, 0
// when none is found.
func cgroupMeanMiB(dataDir string, sbs []*wire.Sandbox) float64 {
	var sum uint64
	n := 0
	for _, sb := range sbs {
		if v, err := cgroupRSS(dataDir, sb.SandboxID); err == nil {
			sum += v
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return float64(sum) / float64(n) / (1 << 20)
}

// cause is an error's first line with its innermost cause kept: the end
// of a server's wrapped message says what ran out.
func cause(err error) string {
	s, _, _ := strings.Cut(err.Error(), "\n")
	const most = 300
	if len(s) > most {
		s = s[:most/3] + " … " + s[len(s)-2*most/3:]
	}
	return s
}
