package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/envdclient"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/template"
)

// RunSteps runs a template build's RUN steps (template.StepRunner) in one
// hidden sandbox of req.TeamID made by the pipeline's build path: the same
// runtime, hardening (user namespace, seccomp, capabilities), network
// policy (internet yes; host, loopback, private and metadata addresses no)
// and limits as any of the team's sandboxes: CPU, memory, processes and a
// disk for the writable layer, as a create asks or gets by default, within
// the team's quota (resolveBuild). It counts toward maxSandboxes while it
// runs, in its build's slot when the build was admitted (AdmitBuild). Each
// command runs through envd as its user, in its workdir, with its env; the
// first that fails ends the batch with an error naming its line, and the
// limit it hit if it hit one (a *template.LimitError). When every command
// passed, the writable layer is captured into req.UpperDir. The sandbox is
// destroyed in every case.
func (m *Manager) RunSteps(ctx context.Context, req template.StepRequest) (err error) {
	if err := checkStepRequest(req); err != nil {
		return err
	}
	ck, err := checkpointer(m.rt)
	if err != nil {
		return fmt.Errorf("build %s: the writable layer of a build step cannot be captured: %w", req.BuildID, err)
	}
	b := newBuild("build", CreateRequest{TeamID: req.TeamID, Timeout: m.cfg.MaxTimeout, Secure: true, AllowInternet: true})
	b.step = &req
	b.counts = !m.admission.buildAdmitted(req.TeamID, req.BuildID)
	sb, err := m.start.run(ctx, buildStep(), b)
	if err != nil {
		return fmt.Errorf("build %s: step sandbox: %w", req.BuildID, err)
	}
	defer func() {
		why := "template build steps done"
		if err != nil {
			why = "template build step failed"
		}
		if derr := m.discard(ctx, sb, why); derr != nil {
			err = errors.Join(err, derr)
		}
	}()
	out := req.Output
	if out == nil {
		out = io.Discard
	}
	fmt.Fprintf(out, "    step sandbox: %s\n", describeLimits(b.limits))
	c := m.envd.of(sb)
	lr, _ := m.rt.(runtime.LimitReporter)
	for _, cmd := range req.Commands {
		var before runtime.LimitCounters
		if lr != nil {
			before, _ = lr.LimitCounters(ctx, sb.ID)
		}
		start := time.Now()
		user, dir := cmd.User, cmd.Workdir
		if user == "" {
			user = "root"
		}
		if dir == "" {
			dir = "/"
		}
		code, rerr := c.Run(ctx, envdclient.Command{Cmd: cmd.Cmd, User: user, Workdir: dir, Env: cmd.Env}, out, out)
		m.inst.auditStep(ctx, sb, cmd, code, rerr, time.Since(start))
		var failed error
		switch {
		case rerr != nil:
			failed = rerr
		case code != 0:
			failed = &template.ExitError{Line: cmd.Line, Cmd: cmd.Cmd, Code: code}
		default:
			continue
		}
		if why := stepLimitHit(context.WithoutCancel(ctx), m.rt, sb, b.quota, lr, before); why != "" {
			failed = &template.LimitError{Msg: fmt.Sprintf("%s %q %s", stepWhere(cmd), cmd.Cmd, why), Err: failed}
		}
		return fmt.Errorf("%s: %w", stepWhere(cmd), failed)
	}
	// Frozen while the layer is copied: one instant of the filesystem,
	// whatever a step left running in the background.
	img := filepath.Join(filepath.Dir(req.UpperDir), ".step-image-"+sb.ID)
	defer os.RemoveAll(img)
	if err := ck.Checkpoint(context.WithoutCancel(ctx), sb.ID, runtime.CheckpointOptions{
		ImageDir: img, LeaveRunning: true, UpperCopy: req.UpperDir, FilesystemOnly: true,
	}); err != nil {
		_ = os.RemoveAll(req.UpperDir)
		return fmt.Errorf("build %s: capture the writable layer: %w", req.BuildID, err)
	}
	return nil
}

func stepWhere(c template.StepCommand) string {
	if c.Line > 0 {
		return fmt.Sprintf("line %d", c.Line)
	}
	return "RUN"
}

func checkStepRequest(req template.StepRequest) error {
	switch {
	case req.TeamID == "":
		return fmt.Errorf("TeamID: required; a build step runs under its team's quota and policy: %w", errdefs.ErrInvalidArgument)
	case req.BuildID == "" || len(req.BuildID) > 128:
		return fmt.Errorf("BuildID: %q must name the build (1-128 bytes): %w", truncateID(req.BuildID), errdefs.ErrInvalidArgument)
	case len(req.Layers) == 0:
		return fmt.Errorf("Layers: at least one layer is needed to run a step on: %w", errdefs.ErrInvalidArgument)
	case len(req.Commands) == 0:
		return fmt.Errorf("Commands: nothing to run: %w", errdefs.ErrInvalidArgument)
	case req.UpperDir == "" || !filepath.IsAbs(req.UpperDir):
		return fmt.Errorf("UpperDir: %q is not an absolute path: %w", req.UpperDir, errdefs.ErrInvalidArgument)
	}
	if _, err := os.Lstat(req.UpperDir); !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("UpperDir: %s already exists; the captured layer goes to a new directory: %w", req.UpperDir, errdefs.ErrInvalidArgument)
	}
	return nil
}

// resolveBuild makes the record of a build step's sandbox: hidden, owned by
// the build's team, on the build's layers, the default tier, the sandbox
// network policy with internet access, and a create's limits: what the
// request asks (refused over the team's quota, naming the field), else what
// a sandbox gets by default, capped at the team's quota, so a step never
// has more than any sandbox of the team could.
func (s *starter) resolveBuild(ctx context.Context, b *build) error {
	req := b.step
	q := b.quota
	defaults := &template.Template{
		CPUCount: capAt(template.DefaultCPUCount, q.CPUCount), MemoryMB: capAt(template.DefaultMemoryMB, q.MemoryMB),
		DiskMB: capAt(template.DefaultDiskMB, q.DiskMB),
	}
	limits, err := resolveLimits(Limits{CPUCount: req.CPUCount, MemoryMB: req.MemoryMB, DiskMB: req.DiskMB, PIDs: capAt(DefaultPIDs, q.PIDs)}, defaults, q)
	if err != nil {
		return err
	}
	isolation, err := s.resolveIsolation(CreateRequest{}, defaults)
	if err != nil {
		return err
	}
	sb := b.sb
	sb.BuildID = req.BuildID
	s.fillFromRequest(sb, b.req, nil, limits, isolation, s.cfg.MaxCommandLifetime)
	sb.DefaultUser, sb.DefaultWorkdir = "root", "/"
	b.layers, b.limits = slices.Clone(req.Layers), limits
	b.pol, err = s.policies.of(ctx, sb)
	return err
}

// capAt is v, or cap when cap is set (> 0) and lower.
func capAt(v, cap int) int {
	if cap > 0 && cap < v {
		return cap
	}
	return v
}

// describeLimits is a step sandbox's limits for the build log.
func describeLimits(l Limits) string {
	disk := "no disk limit"
	if l.DiskMB > 0 {
		disk = fmt.Sprintf("%d MiB disk", l.DiskMB)
	}
	return fmt.Sprintf("%d CPU(s), %d MiB memory, %s, %d processes", l.CPUCount, l.MemoryMB, disk, l.PIDs)
}

// stepLimitHit says which limit a failed step command hit, if one: a
// process killed for memory or a fork refused since before, or the disk
// full. "" when none did (the command failed on its own).
func stepLimitHit(ctx context.Context, rt runtime.Runtime, sb *Sandbox, q Quota, lr runtime.LimitReporter, before runtime.LimitCounters) string {
	if lr != nil {
		if now, err := lr.LimitCounters(ctx, sb.ID); err == nil {
			switch {
			case now.OOMKills > before.OOMKills:
				return "was killed: it used more than " + limitOf("memory", "MiB", sb.MemoryMB, q.MemoryMB, "memoryMB", "--memory-mb")
			case now.PIDsMax > before.PIDsMax:
				return "could not start a process: it ran into " + limitOf("process", "processes and threads", sb.PIDs, q.PIDs, "", "--pids")
			}
		}
	}
	if st, err := rt.Stats(ctx, sb.ID); err == nil && diskFull(st) {
		return "wrote more than " + limitOf("disk", "MiB", sb.DiskMB, q.DiskMB, "", "--disk-mb") + `; writes failed with "No space left on device"`
	}
	return ""
}

// limitOf names a build step's limit of n units and how to raise it: the
// team's quota (an operator's flag) or, when the step got less than the
// quota, the build request's field that asks for more.
func limitOf(what, unit string, n, quota int, field, flag string) string {
	raise := fmt.Sprintf("an operator raises it with `agentbox team quota set <team> %s N`", flag)
	switch {
	case quota > 0 && n >= quota:
		return fmt.Sprintf("the team's %s quota of %d %s (%s)", what, n, unit, raise)
	case field != "":
		return fmt.Sprintf("the build step's %s limit of %d %s (the build's %s, or a sandbox's default; ask for up to the team's quota of %d with %s in the build request)", what, n, unit, field, quota, field)
	}
	return fmt.Sprintf("the build step's %s limit of %d %s (a sandbox's default under the team's quota of %d)", what, n, unit, quota)
}

// auditStep records one build command like a process start in any sandbox
// (the gateway records those; build steps do not pass through it).
func (i *instruments) auditStep(ctx context.Context, sb *Sandbox, c template.StepCommand, code int, err error, took time.Duration) {
	if i.audit == nil {
		return
	}
	fields := map[string]any{"cmd": "/bin/sh", "args": []string{"-c", c.Cmd}, "build": sb.BuildID, "line": c.Line, "exitCode": code, "took_ms": took.Milliseconds()}
	decision, reason := audit.Allowed, ""
	if err != nil {
		decision, reason = audit.Denied, err.Error()
	}
	i.audit.Record(ctx, audit.Event{SandboxID: sb.ID, TeamID: sb.TeamID, Kind: audit.KindProcess, Action: "start", Decision: decision, Reason: reason, Fields: fields})
}

var _ template.StepRunner = (*Manager)(nil)
