package benchmark

import (
	"context"
	"errors"
	"fmt"

	"github.com/agentbox/agentbox/e2e/wire"
)

// commandRows is target 4: the command round trip p50 per tier against
// the same shell (`bash -l -c true`) fork/exec'd chrooted in the template
// plus one loopback HTTP round trip, sampled alternately.
func commandRows(ctx context.Context, a *allRun) []TargetRow {
	var rows []TargetRow
	var fl *commandFloor
	var err error
	if a.layers == nil {
		err = errors.New("no template layers for the shell floor (--template-dir)")
	} else {
		var closeFloor func()
		if fl, closeFloor, err = newCommandFloor(ctx, a.layers); err == nil {
			defer closeFloor()
		}
	}
	for _, tier := range []string{"container", "gvisor"} {
		figure := fmt.Sprintf("%s: command round trip p50 vs `bash -l -c true` fork/exec + loopback HTTP", tier)
		if err != nil {
			rows = append(rows, failed(4, figure, err))
			continue
		}
		rows = append(rows, commandRow(ctx, a, fl, tier, figure))
	}
	return rows
}

func commandRow(ctx context.Context, a *allRun, fl *commandFloor, tier, figure string) TargetRow {
	sb, err := a.c.Create(ctx, wire.CreateRequest{TemplateID: a.cfg.Template, Timeout: 600, Metadata: map[string]string{"agentbox.isolation": tier, "bench": "commands"}})
	if err != nil {
		return failed(4, figure, err)
	}
	defer func() { _ = a.c.Kill(context.WithoutCancel(ctx), sb.SandboxID) }()
	s, err := fl.sample(ctx, a.c, sb, a.cfg.Commands, false, a.log)
	if err != nil {
		return failed(4, figure, err)
	}
	if len(s.rtt) == 0 {
		return failed(4, figure, fmt.Errorf("all %d commands failed", s.errs))
	}
	r := atMost(4, fmt.Sprintf("%s (%d samples, %d failed)", figure, len(s.rtt), s.errs), pct(s.rtt, 50), pct(s.floor, 50), 1.5)
	r.Met = r.Met && s.errs == 0
	return r
}

// transferRows is target 5: download throughput of SizeMB, identity and
// gzip, against the upload of the same bytes to the same sandbox (≥ 0.8×),
// with the server's RSS before and after as a note (memory flat).
func transferRows(ctx context.Context, a *allRun) []TargetRow {
	mb := a.cfg.SizeMB
	figure := func(coding string) string {
		return fmt.Sprintf("download %d MB, %s: rate vs upload rate of the same bytes", mb, coding)
	}
	sb, err := a.c.Create(ctx, wire.CreateRequest{TemplateID: a.cfg.Template, Timeout: 1200, Metadata: map[string]string{"bench": "io"}})
	if err != nil {
		return []TargetRow{failed(5, figure("identity"), err), failed(5, figure("gzip"), err)}
	}
	defer func() { _ = a.c.Kill(context.WithoutCancel(ctx), sb.SandboxID) }()
	rssBefore := rssKB(a.cfg.ServerPID)
	tr := transfers(ctx, a.c, sb, mb)
	rssAfter := rssKB(a.cfg.ServerPID)
	if a.cfg.ServerPID > 0 {
		a.note("(5) server RSS around the %d MB transfers: %.1f MiB → %.1f MiB", mb, float64(rssBefore)/1024, float64(rssAfter)/1024)
	}
	var rows []TargetRow
	for i, coding := range downloadCodings() {
		err := tr.err
		if err == nil {
			err = tr.downErr[i]
		}
		if err != nil {
			rows = append(rows, failed(5, figure(coding), err))
			continue
		}
		up, down := float64(mb)/tr.up.Seconds(), float64(mb)/tr.down[i].Seconds()
		r := TargetRow{Target: 5, Figure: figure(coding), Value: fmt.Sprintf("%.0f MB/s", down), Floor: fmt.Sprintf("%.0f MB/s", up),
			Ratio: down / up, Goal: "≥ 0.8x"}
		r.Met = r.Ratio >= 0.8
		rows = append(rows, r)
	}
	return rows
}
