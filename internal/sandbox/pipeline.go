package sandbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/network"
	"github.com/agentbox/agentbox/internal/rollback"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/template"
)

// The pipeline: every way a sandbox comes to run is this one ordered list of
// named steps, with one step swapped per path. A guarantee added to a step
// (a check, a limit, an audit event) holds on every path that runs it.
//
//	step              create (template)  snapshot restore / fork  warm-pool claim   files-only resume  build step
//	reserve           team quota, maxSandboxes, a create slot (resume: slot only; the paused sandbox already counts; claim: no slot)
//	resolve           template           snapshot                 pooled sandbox    paused sandbox     layers
//	persist creating  row "creating"     row "creating"           row "creating"    row "resuming"     row "creating"
//	attach network    netns + policy     netns + policy           set policy        (kept)             netns + policy
//	start             start container    restore image            claim pooled      boot files         start container
//	init envd         first /init        re-/init (restored)      re-/init          first /init        first /init
//	wait ready        ready command      (fresh boots only)       -                 ready command      -
//	persist running   row "running"
//	register          visible to the API (a build step's sandbox stays hidden)
//
// A memory resume is this pipeline too, with steps swapped (resumeMemory);
// a pause, which starts nothing, is its own list (pauseSteps); both are in
// pause.go.
//
// Each step that makes something pushes its undo onto the build's rollback
// list; a failing step runs the list newest first, writes a failure audit
// event naming the step and returns the step's error.
const (
	StepReserve         = "reserve"
	StepResolve         = "resolve"
	StepPersistCreating = "persist creating"
	StepAttachNetwork   = "attach network"
	StepStart           = "start"
	StepInitEnvd        = "init envd"
	StepWaitReady       = "wait ready"
	StepPersistRunning  = "persist running"
	StepRegister        = "register"
)

// step is one named stage. run gets the build's context: the request's for
// the steps before the host is touched (a client that goes away stops the
// wait for a slot), then one that is not cancelled, so setup is never
// half-cancelled.
type step struct {
	name string // one of the Step names
	what string // what this path does in it ("restore image"), for logs
	run  func(s *starter, ctx context.Context, b *build) error
}

// pipeline is the ordered list of steps of one path.
type pipeline []step

// swap returns a copy of p with the step called name replaced by s (a
// different implementation of the same stage).
func (p pipeline) swap(name string, what string, run func(s *starter, ctx context.Context, b *build) error) pipeline {
	out := slices.Clone(p)
	for i := range out {
		if out[i].name == name {
			out[i] = step{name: name, what: what, run: run}
			return out
		}
	}
	panic("sandbox: no pipeline step " + name)
}

// coldStart is the pipeline of a create from a template; every other path
// is it with steps swapped (below).
func coldStart() pipeline {
	return pipeline{
		{StepReserve, "team quota and a create slot", (*starter).reserve},
		{StepResolve, "template", (*starter).resolveTemplate},
		{StepPersistCreating, "row creating", (*starter).persistCreating},
		{StepAttachNetwork, "netns, address, policy", (*starter).attachNetwork},
		{StepStart, "start container", (*starter).startContainer},
		{StepInitEnvd, "envd /init", (*starter).initEnvdStep},
		{StepWaitReady, "ready command", (*starter).waitReadyStep},
		{StepPersistRunning, "row running", (*starter).persistRunning},
		{StepRegister, "visible", (*starter).register},
	}
}

// restoreSnapshot starts a new sandbox from a snapshot (a create whose
// templateID names one of the team's snapshots, and each copy of a fork).
func restoreSnapshot() pipeline {
	return coldStart().
		swap(StepResolve, "snapshot", (*starter).resolveSnapshot).
		swap(StepStart, "restore image", (*starter).restoreImage)
}

// claimPooled hands a warm sandbox to a create.
func claimPooled() pipeline {
	return coldStart().
		swap(StepResolve, "pooled sandbox", (*starter).resolvePooled).
		swap(StepAttachNetwork, "set policy", (*starter).setPolicy).
		swap(StepStart, "claim pooled", (*starter).checkPooled)
}

// resumeFiles boots a paused sandbox fresh on its files, in place.
func resumeFiles() pipeline {
	return coldStart().
		swap(StepResolve, "paused sandbox", (*starter).resolvePaused).
		swap(StepPersistCreating, "row resuming", (*starter).persistResuming).
		swap(StepAttachNetwork, "kept", func(*starter, context.Context, *build) error { return nil }).
		swap(StepStart, "boot files", (*starter).bootFiles)
}

// buildStep starts the hidden sandbox a template build's RUN steps run in.
func buildStep() pipeline {
	return coldStart().swap(StepResolve, "build layers", (*starter).resolveBuild)
}

// build is one sandbox being made: the request and what the steps found
// and made so far.
type build struct {
	path   string // create, restore, fork, claim, resume, build: logs and audit
	action string // audit action: "create" or "resume"
	req    CreateRequest
	// counts: the sandbox is new to its team (maxSandboxes applies).
	counts bool

	quota   Quota
	sb      *Sandbox // the record; its id is known from the start
	prev    *Sandbox // resume: the record to go back to
	tplID   string   // restore: the templateID the new sandbox reports
	snap    *Snapshot
	step    *template.StepRequest // build: the RUN steps' request
	layers  []string
	volumes []runtime.VolumeMount // claimed (volumes.go)
	limits  Limits
	pol     network.Policy
	netns   string
	startup string // template start command (fresh boots)
	ready   string // template ready command (fresh boots)
	// fresh: envd boots as a new init and takes its first /init; otherwise
	// it was restored or claimed and envdAuth authorises its re-/init.
	fresh    bool
	envdAuth string

	failed  string // the step that failed, if one did
	undo    rollback.List
	release []func() // run when the build ends, whatever happened
	took    map[string]time.Duration
}

func newBuild(path string, req CreateRequest) *build {
	now := time.Now().UTC()
	id := req.ID
	if id == "" {
		id = newID()
	}
	return &build{
		path: path, action: "create", req: req, counts: true, fresh: true,
		sb:   &Sandbox{ID: id, TeamID: req.TeamID, APIKeyID: req.APIKeyID, TemplateID: req.Template, State: StateCreating, StartedAt: now},
		took: map[string]time.Duration{},
	}
}

// errNoClaim: the warm pool cannot serve this request; start cold.
var errNoClaim = errors.New("no warm sandbox for this request")

// run runs p for b. On failure it undoes what the steps made, writes a
// failure audit event naming the step, and returns the step's error.
func (s *starter) run(ctx context.Context, p pipeline, b *build) (_ *Sandbox, err error) {
	defer func() {
		for _, f := range slices.Backward(b.release) {
			f()
		}
	}()
	ctx, span := s.inst.traceRun(ctx, b) // trace.go; nil when not tracing
	defer func() { endSpan(span, b, err) }()
	start := time.Now()
	sctx := context.WithoutCancel(ctx)
	for _, next := range p {
		c := sctx
		if next.name == StepReserve || next.name == StepResolve {
			c = ctx
		}
		c, stepSpan := s.inst.traceStep(c, next.name)
		t := time.Now()
		err := next.run(s, c, b)
		b.took[next.name] = time.Since(t)
		if err == nil {
			err = s.inst.stepDone(b.path, next.name)
		}
		endSpan(stepSpan, nil, err)
		if err == nil {
			s.inst.crashAfter(b.path, next.name) // crash.go
		}
		if err != nil {
			b.failed = next.name
			if uerr := b.undo.Run(sctx); uerr != nil {
				s.log.Error("undo after failed "+b.path, "sandbox", b.sb.ID, "step", next.name, "err", uerr)
			}
			if !errors.Is(err, errNoClaim) {
				s.inst.auditLifecycle(sctx, b.sb, b.action, "denied", err.Error(), map[string]any{"path": b.path, "step": next.name})
				s.inst.obs.Created(b.path, b.sb.Isolation, b.sb.TemplateID, false, time.Since(start), b.took)
			}
			return nil, s.admission.diskFailed(startWhat(b.path), err)
		}
	}
	b.undo.Release()
	sb := b.sb
	fields := map[string]any{"took_ms": time.Since(start).Milliseconds(), "path": b.path}
	if sb.BuildID != "" {
		fields["build"] = sb.BuildID
	}
	s.inst.auditLifecycle(sctx, sb, b.action, "allowed", "", fields)
	s.inst.obs.Created(b.path, sb.Isolation, sb.TemplateID, true, time.Since(start), b.took)
	s.log.Info("sandbox "+b.path, "sandbox", sb.ID, "template", sb.TemplateID, "ip", sb.IP, "team", sb.TeamID, "took", time.Since(start).Round(time.Millisecond),
		"network", b.took[StepAttachNetwork].Round(time.Millisecond), "start", b.took[StepStart].Round(time.Millisecond),
		"envd", (b.took[StepInitEnvd] + b.took[StepWaitReady]).Round(time.Millisecond))
	return clone(sb), nil
}

// ---- reserve ----

// reserve reads the team's quota, counts the sandbox against its
// maxSandboxes (new sandboxes only) and waits for a create slot
// (admission.go; not for a warm claim). Both are held until the build
// ends.
func (s *starter) reserve(ctx context.Context, b *build) error {
	q, err := s.admission.teamQuota(ctx, b.req.TeamID)
	if err != nil {
		return err
	}
	b.quota = q
	if b.counts {
		release, err := s.admission.reserveSandbox(b.req.TeamID, q)
		if err != nil {
			return err
		}
		b.release = append(b.release, release)
	}
	if b.path == "claim" {
		// A claim starts nothing on the host: it must not queue behind
		// the cold starts (refills included) the slots pace.
		return nil
	}
	if err := s.admission.admitStart(b.path); err != nil {
		return err
	}
	slot := s.admission.createSlot
	if b.path == "fork" {
		slot = s.admission.forkSlot // forkslots.go
	}
	release, err := slot(ctx)
	if err != nil {
		return err
	}
	b.release = append(b.release, release)
	return nil
}

// ---- resolve: the request against its source; every field is honoured
// or refused with the field's name ----

// resolveTemplate makes the record of a cold start from req.Template.
func (s *starter) resolveTemplate(ctx context.Context, b *build) error {
	req := b.req
	tpl, err := s.templates.Get(ctx, req.TeamID, req.Template)
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return fmt.Errorf("templateID: template %q not found; list templates with GET /templates or `agentbox template ls`: %w", req.Template, errdefs.ErrInvalidArgument)
		}
		return err
	}
	if err := checkTimeout(s.cfg.MaxTimeout, req.Timeout); err != nil {
		return err
	}
	isolation, err := s.resolveIsolation(req, tpl)
	if err != nil {
		return err
	}
	limits, err := resolveLimits(req.Limits, tpl, b.quota)
	if err != nil {
		return err
	}
	cmdLife, err := s.resolveCommandLifetime(req.MaxCommand)
	if err != nil {
		return err
	}
	sb := b.sb
	sb.TemplateID = tpl.ID
	if len(tpl.Aliases) > 0 {
		sb.Alias = tpl.Aliases[0]
	}
	s.fillFromRequest(sb, req, mergeEnv(tpl.Env, req.EnvVars), limits, isolation, cmdLife)
	sb.DefaultUser, sb.DefaultWorkdir = tpl.DefaultUser, tpl.DefaultWorkdir
	if req.Workdir != "" {
		sb.DefaultWorkdir = req.Workdir
	}
	b.layers, b.limits = tpl.Layers, limits
	b.startup, b.ready = tpl.StartCmd, tpl.ReadyCmd
	if err := s.claimVolumes(ctx, b, req.VolumeMounts, false); err != nil {
		return err
	}
	b.pol, err = s.policies.of(ctx, sb)
	return err
}

// fillFromRequest copies what every new sandbox takes from its request.
func (s *starter) fillFromRequest(sb *Sandbox, req CreateRequest, env map[string]string, l Limits, isolation string, cmdLife time.Duration) {
	sb.Secure, sb.AllowInternet, sb.Network = req.Secure, req.AllowInternet, req.Network
	sb.Metadata, sb.EnvVars = req.Metadata, env
	sb.CPUCount, sb.MemoryMB, sb.DiskMB, sb.PIDs, sb.TmpMB = l.CPUCount, l.MemoryMB, l.DiskMB, l.PIDs, l.TmpMB
	sb.Isolation = isolation
	sb.MaxCommandSeconds = int64(cmdLife / time.Second)
	sb.EndAt = sb.StartedAt.Add(req.Timeout)
	sb.Lifecycle = req.Lifecycle.apply(req.Timeout)
}

// resolveSnapshot makes the record of a sandbox restored from b.snap. A
// memory image fixes the limits and the tier it was taken with: a request
// for others is refused, naming the field. A filesystem-only snapshot boots
// fresh, so the request's limits and tier apply as on a cold start.
func (s *starter) resolveSnapshot(ctx context.Context, b *build) error {
	if _, err := checkpointer(s.rt); err != nil {
		return err
	}
	req, snap := b.req, b.snap
	if err := checkTimeout(s.cfg.MaxTimeout, req.Timeout); err != nil {
		return err
	}
	snapLimits := Limits{CPUCount: snap.CPUCount, MemoryMB: snap.MemoryMB, DiskMB: snap.DiskMB, PIDs: snap.PIDs, TmpMB: snap.TmpMB}
	isoTpl := &template.Template{Isolation: snap.Isolation}
	var (
		limits    Limits
		isolation string
		err       error
	)
	if snap.FilesystemOnly {
		merged := snapLimits
		for _, f := range []struct{ dst, v *int }{
			{&merged.CPUCount, &req.Limits.CPUCount}, {&merged.MemoryMB, &req.Limits.MemoryMB}, {&merged.DiskMB, &req.Limits.DiskMB},
			{&merged.PIDs, &req.Limits.PIDs}, {&merged.TmpMB, &req.Limits.TmpMB},
		} {
			if *f.v != 0 {
				*f.dst = *f.v
			}
		}
		if limits, err = resolveLimits(merged, &template.Template{}, b.quota); err != nil {
			return err
		}
		if isolation, err = s.resolveIsolation(req, isoTpl); err != nil {
			return err
		}
	} else {
		if err := memoryImageFixes(snap, req, snapLimits); err != nil {
			return err
		}
		// The team's quota may have been lowered since it was taken.
		if limits, err = resolveLimits(snapLimits, &template.Template{}, b.quota); err != nil {
			return fmt.Errorf("snapshot %s was taken with limits over the team's quota: %w", snap.ID, err)
		}
		limits = snapLimits
		req.Isolation, req.Metadata = snap.Isolation, withoutIsolation(req.Metadata)
		if isolation, err = s.resolveIsolation(req, isoTpl); err != nil {
			return err
		}
	}
	cmdLife, err := s.resolveCommandLifetime(req.MaxCommand)
	if err != nil {
		return err
	}
	sb := b.sb
	sb.TemplateID, sb.Alias = b.tplID, snap.Alias
	s.fillFromRequest(sb, req, mergeEnv(snap.EnvVars, req.EnvVars), limits, isolation, cmdLife)
	// After fillFromRequest, which sets the whole Lifecycle: the snapshot's
	// layers stay while the sandbox lives (snapshots.gc).
	sb.BaseSnapshot = snap.ID
	sb.Metadata = b.req.Metadata
	sb.DefaultUser, sb.DefaultWorkdir = snap.DefaultUser, snap.DefaultWorkdir
	b.layers, b.limits = snap.Layers, limits
	// The snapshot's sandbox's volumes, by id: a memory image has files
	// open in them, and its mount table names their paths.
	if len(req.VolumeMounts) > 0 {
		return fmt.Errorf("volumeMounts: snapshot %s mounts the volumes its sandbox had; omit volumeMounts: %w", snap.ID, errdefs.ErrInvalidArgument)
	}
	if err := s.claimVolumes(ctx, b, snap.VolumeMounts, true); err != nil {
		return fmt.Errorf("snapshot %s: %w", snap.ID, err)
	}
	if snap.FilesystemOnly {
		b.startup, b.ready = s.templateCommands(ctx, sb)
	} else {
		b.fresh = false
		if snap.Secure {
			b.envdAuth = s.envd.token(snap.SandboxID)
		}
	}
	b.pol, err = s.policies.of(ctx, sb)
	return err
}

// memoryImageFixes refuses request fields a memory image cannot honour.
func memoryImageFixes(snap *Snapshot, req CreateRequest, l Limits) error {
	for _, f := range []struct {
		name        string
		asked, have int
	}{
		{"cpuCount", req.Limits.CPUCount, l.CPUCount}, {"memoryMB", req.Limits.MemoryMB, l.MemoryMB},
		{"diskSizeMB", req.Limits.DiskMB, l.DiskMB}, {"pids", req.Limits.PIDs, l.PIDs}, {"tmpSizeMB", req.Limits.TmpMB, l.TmpMB},
	} {
		if f.asked != 0 && f.asked != f.have {
			return fmt.Errorf("%s: snapshot %s holds a memory image taken with %s %d, and its sandboxes keep it; omit %s or pass %d (a filesystem-only snapshot takes new limits): %w",
				f.name, snap.ID, f.name, f.have, f.name, f.have, errdefs.ErrInvalidArgument)
		}
	}
	have := snap.Isolation
	if have == "" {
		have = IsolationContainer
	}
	asked := req.Isolation
	if asked == "" {
		asked = req.Metadata[MetadataIsolation]
	}
	if asked != "" && asked != have {
		return fmt.Errorf("isolation: snapshot %s holds a memory image of a %q sandbox, which restores only on that tier; omit isolation or ask for %q (a filesystem-only snapshot boots on any tier): %w",
			snap.ID, have, have, errdefs.ErrInvalidArgument)
	}
	return nil
}

func withoutIsolation(md map[string]string) map[string]string {
	if _, ok := md[MetadataIsolation]; !ok {
		return md
	}
	out := maps.Clone(md)
	delete(out, MetadataIsolation)
	return out
}

// templateCommands returns the start and ready commands of the template sb
// was made from (through its snapshot), for a fresh boot.
func (s *starter) templateCommands(ctx context.Context, sb *Sandbox) (start, ready string) {
	tplID := sb.TemplateID
	if sb.BaseSnapshot != "" && s.snaps() != nil {
		if snap, err := s.snaps().load(sb.BaseSnapshot); err == nil {
			tplID = snap.TemplateID
		}
	}
	tpl, err := s.templates.Get(ctx, sb.TeamID, tplID)
	if err != nil {
		s.log.Warn("fresh boot without the template's start command", "sandbox", sb.ID, "template", tplID, "err", err)
		return "", ""
	}
	return tpl.StartCmd, tpl.ReadyCmd
}

// ---- persist ----

// persistCreating writes the record before the host is touched: a crash
// from here on is cleaned up by Reconcile, never leaked.
func (s *starter) persistCreating(ctx context.Context, b *build) error {
	b.sb.State = StateCreating
	if err := s.rows.save(ctx, b.sb); err != nil {
		return err
	}
	id := b.sb.ID
	b.undo.Add(StepPersistCreating, func(ctx context.Context) error { return s.rows.drop(ctx, id) })
	s.inst.fault("create:persisted")
	return nil
}

// persistRunning marks the sandbox running in the store.
func (s *starter) persistRunning(ctx context.Context, b *build) error {
	b.sb.State = StateRunning
	return s.rows.save(ctx, b.sb)
}

// register makes the sandbox visible: the API, the gateway and the reaper
// see it from now on (a build step's sandbox only the reaper).
func (s *starter) register(ctx context.Context, b *build) error {
	s.recs.register(b.sb)
	return nil
}

// ---- attach network ----

// attachNetwork makes the sandbox's network namespace, address and policy.
func (s *starter) attachNetwork(ctx context.Context, b *build) error {
	id := b.sb.ID
	ep, err := s.net.Attach(ctx, id, b.pol)
	if err != nil {
		return fmt.Errorf("sandbox %s: network: %w", id, err)
	}
	b.undo.Add(StepAttachNetwork, func(ctx context.Context) error { return s.net.Detach(ctx, id) })
	b.sb.IP, b.netns = ep.IP, ep.NetNSPath
	return nil
}

// setPolicy gives a claimed warm sandbox the request's policy (its team,
// key and internet access) on the network it already has.
func (s *starter) setPolicy(ctx context.Context, b *build) error {
	if err := s.net.SetPolicy(ctx, b.sb.ID, b.pol); err != nil {
		return fmt.Errorf("sandbox %s: network policy: %w", b.sb.ID, err)
	}
	return nil
}

// ---- start ----

func (s *starter) spec(b *build) runtime.Spec {
	return runtime.Spec{
		ID: b.sb.ID, Layers: b.layers, NetNSPath: b.netns, DNS: s.net.DNS(),
		Resources: b.limits.resources(), Runtime: RuntimeTier(b.sb.Isolation), Volumes: b.volumes, BootID: b.sb.BootID,
	}
}

// startContainer builds the bundle and starts envd as the sandbox's init.
func (s *starter) startContainer(ctx context.Context, b *build) error {
	id := b.sb.ID
	b.sb.BootID = runtime.NewBootID()
	if err := s.rt.Create(ctx, s.spec(b)); err != nil {
		return fmt.Errorf("sandbox %s: start container: %w", id, err)
	}
	b.undo.Add(StepStart, func(ctx context.Context) error { return s.rt.Delete(ctx, id) })
	return nil
}

// restoreImage starts the sandbox from the snapshot's image (memory, or a
// fresh boot on its layers) in a new bundle and network namespace.
func (s *starter) restoreImage(ctx context.Context, b *build) error {
	ck, err := checkpointer(s.rt)
	if err != nil {
		return err
	}
	id := b.sb.ID
	// A memory image keeps the boot it was taken in, as a VM's does.
	b.sb.BootID = b.snap.BootID
	if b.snap.FilesystemOnly {
		b.sb.BootID = runtime.NewBootID()
	}
	opts := runtime.RestoreOptions{ImageDir: s.snaps().image(b.snap.ID), NewNetwork: true, FilesystemOnly: b.snap.FilesystemOnly}
	if err := ck.Restore(ctx, s.spec(b), opts); err != nil {
		return fmt.Errorf("sandbox %s: restore snapshot %s: %w", id, b.snap.ID, err)
	}
	b.undo.Add(StepStart, func(ctx context.Context) error { return s.rt.Delete(ctx, id) })
	return nil
}

// checkPooled confirms the claimed warm sandbox's container still runs.
func (s *starter) checkPooled(ctx context.Context, b *build) error {
	st, err := s.rt.State(ctx, b.sb.ID)
	if err != nil {
		return fmt.Errorf("warm sandbox %s: %w", b.sb.ID, err)
	}
	if st != runtime.StatusRunning {
		return fmt.Errorf("warm sandbox %s is %s: %w", b.sb.ID, st, errdefs.ErrUnavailable)
	}
	return nil
}

// ---- envd ----

// initEnvdStep waits for envd and hands it the sandbox's identity: env,
// default user and workdir, command cap, token, and (on a fresh boot) the
// template's start command. A restored or claimed envd proves the change
// with the token it already holds.
func (s *starter) initEnvdStep(ctx context.Context, b *build) error {
	if b.fresh {
		if err := s.envd.init(ctx, b.sb, b.startup, b.pol); err != nil {
			return fmt.Errorf("sandbox %s: envd did not start: %w", b.sb.ID, err)
		}
		return nil
	}
	if err := s.envd.reinit(ctx, b.sb, b.envdAuth, b.pol); err != nil {
		return fmt.Errorf("sandbox %s: %w", b.sb.ID, err)
	}
	return nil
}

// waitReadyStep runs the template's ready command until it passes.
func (s *starter) waitReadyStep(ctx context.Context, b *build) error {
	if err := s.envd.waitReady(ctx, b.sb, b.ready); err != nil {
		return fmt.Errorf("sandbox %s: template %s not ready: %w", b.sb.ID, b.sb.TemplateID, err)
	}
	return nil
}
