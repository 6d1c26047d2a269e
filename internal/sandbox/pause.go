package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/rollback"
	"github.com/agentbox/agentbox/internal/runtime"
)

// Pause and memory resume, each one list of named steps.
//
//	pause                       memory resume (pipeline path "resume-memory", coldStart with steps swapped)
//	check     not paused yet    reserve           none: the paused sandbox already counts
//	persist   row "pausing"     resolve           paused sandbox
//	meter     last usage        persist creating  row "resuming"
//	thaw      idle freeze off   attach network    kept
//	checkpoint image to disk    start             restore memory image
//	persist   row "paused"      init envd         kept (the image holds envd's state)
//	forget    samples, idle     wait ready        kept
//	                            persist running   row "running"
//	                            register          visible again
//
// A pause is no sandbox start, so it has a list of its own (pauseSteps)
// run by runPause; the step hook and tracing see its steps by name as
// they see the pipeline's.
const (
	StepPauseCheck     = "check"
	StepPersistPausing = "persist pausing"
	StepMeter          = "meter"
	StepThaw           = "thaw"
	StepCheckpoint     = "checkpoint"
	StepPersistPaused  = "persist paused"
	StepForget         = "forget"
	pausePath          = "pause"
)

// pauser runs pauses and resumes: the steps of pauseSteps are its
// methods; a resume runs one of the start pipeline's resume paths. It
// reaches the records through recs; the idle state and the metric samples
// of a sandbox it reaches through thaw and forget.
type pauser struct {
	log       *slog.Logger
	inst      *instruments
	rt        runtime.Runtime
	admission *admission
	metering  *metering
	recs      records
	start     *starter                                   // a resume is a start pipeline path
	thaw      func(ctx context.Context, id string) error // undo an idle freeze
	forget    func(id string)                            // drop samples and idle state
}

// pause checkpoints sandbox id of teamID ("" any): expired marks an
// auto-pause at the end of the lifetime, which leaves no lifetime to keep
// (a resume gets the original one again); memory false keeps only the
// files.
func (p *pauser) pause(ctx context.Context, teamID, id string, expired, memory bool) (err error) {
	defer p.inst.observe(opName("pause", memory), time.Now(), &err)
	op := &pauseOp{teamID: teamID, id: id, expired: expired, memory: memory, start: time.Now()}
	return p.runPause(context.WithoutCancel(ctx), pauseSteps(), op)
}

// resume is Resume; memory false boots the sandbox fresh on its files even
// when its pause kept the memory (which is then dropped).
func (p *pauser) resume(ctx context.Context, teamID, id string, timeout time.Duration, auto, memory bool) (_ *Sandbox, didResume bool, err error) {
	defer func(start time.Time) {
		if didResume || err != nil { // a running sandbox is no resume
			p.inst.observe(opName("resume", memory), start, &err)
		}
	}(time.Now())
	ctx = context.WithoutCancel(ctx)
	// A pause or resume in flight finishes first.
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		sb, err := p.recs.Get(ctx, teamID, id)
		if err != nil || sb.TeamID == poolTeam || sb.BuildID != "" || sb.State == StateKilling || sb.State == StateCreating {
			return nil, false, notFound(id)
		}
		st, autoOK := sb.State, sb.AutoResume && !sb.PausedFS
		switch {
		case st == StateRunning:
			return sb, false, nil
		case st == StatePaused && auto && !autoOK:
			return nil, false, fmt.Errorf("sandbox %q is paused and has no autoResume: %w", id, errdefs.ErrNotFound)
		case st == StatePaused:
		case time.Now().After(deadline):
			return nil, false, conflict(id, st)
		default:
			continue
		}
		break
	}
	ck, err := checkpointer(p.rt)
	if err != nil {
		return nil, false, err
	}
	start := time.Now()
	fresh := !memory
	if sb, err := p.recs.Get(ctx, teamID, id); err == nil && sb.PausedFS {
		fresh = true
	}
	// Either way a resume is a sandbox start: the pipeline's resume paths,
	// a fresh boot on the files (pipeline.go) or the memory image (pause.go).
	steps, path := resumeMemory(), "resume-memory"
	if fresh {
		steps, path = resumeFiles(), "resume"
	}
	b := newBuild(path, CreateRequest{TeamID: teamID, Timeout: timeout})
	b.action, b.counts, b.sb.ID = "resume", false, id
	sb, err := p.start.run(ctx, steps, b)
	if err != nil {
		if errors.Is(err, errdefs.ErrConflict) { // someone else resumed it meanwhile
			return p.resume(ctx, teamID, id, timeout, auto, memory)
		}
		if errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrNoSpace) {
			return nil, false, err
		}
		p.log.Error("resume failed; sandbox stays paused", "sandbox", id, "files", fresh, "err", err)
		return nil, false, fmt.Errorf("sandbox %s: resume: %v: %w", id, err, errdefs.ErrUnavailable)
	}
	if err := ck.DropCheckpoint(ctx, id); err != nil {
		p.log.Warn("remove pause image", "sandbox", id, "err", err)
	}
	p.log.Info("sandbox resumed", "sandbox", id, "auto", auto, "files", fresh, "took", time.Since(start).Round(time.Millisecond))
	return sb, true, nil
}

// pauseOp is one pause: the request and what its steps found.
type pauseOp struct {
	teamID, id      string
	expired, memory bool

	ck    runtime.Checkpointer
	prev  *Sandbox // the running record, to go back to
	undo  rollback.List
	start time.Time
}

// pauseStep is one named stage of a pause.
type pauseStep struct {
	name string
	what string
	run  func(p *pauser, ctx context.Context, op *pauseOp) error
}

// pauseSteps is the pause, in order.
func pauseSteps() []pauseStep {
	return []pauseStep{
		{StepPauseCheck, "checkpointer, not paused yet", (*pauser).pauseCheck},
		{StepPersistPausing, "row pausing", (*pauser).persistPausing},
		{StepMeter, "last usage", (*pauser).pauseMeter},
		{StepThaw, "idle freeze off", (*pauser).pauseThaw},
		{StepCheckpoint, "image to disk", (*pauser).pauseCheckpoint},
		{StepPersistPaused, "row paused", (*pauser).persistPaused},
		{StepForget, "samples and idle state", (*pauser).pauseForget},
	}
}

// runPause runs steps for op; a failing step runs the undo list newest
// first and returns the step's error.
func (p *pauser) runPause(ctx context.Context, steps []pauseStep, op *pauseOp) error {
	for _, s := range steps {
		c, span := p.inst.traceStep(ctx, s.name)
		err := s.run(p, c, op)
		if err == nil {
			err = p.inst.stepDone(pausePath, s.name)
		}
		endSpan(span, nil, err)
		if err != nil {
			if uerr := op.undo.Run(ctx); uerr != nil {
				p.log.Error("undo after failed pause", "sandbox", op.id, "step", s.name, "err", uerr)
			}
			return p.admission.diskFailed("pause a sandbox", err)
		}
	}
	op.undo.Release()
	p.log.Info("sandbox paused", "sandbox", op.id, "took", time.Since(op.start).Round(time.Millisecond))
	p.inst.auditLifecycle(ctx, op.prev, "pause", "allowed", "", map[string]any{"memory": op.memory, "expired": op.expired})
	return nil
}

// pauseCheck refuses a pause of a sandbox already paused (or pausing), and
// one that would write an image onto a full data disk.
func (p *pauser) pauseCheck(ctx context.Context, op *pauseOp) error {
	if !op.expired { // an auto-pause tries anyway: refusing it would end the sandbox
		if err := p.admission.admitDisk("pause a sandbox"); err != nil {
			return err
		}
	}
	ck, err := checkpointer(p.rt)
	if err != nil {
		return err
	}
	op.ck = ck
	// Not found: persistPausing refuses it, naming it.
	if sb, err := p.recs.Get(ctx, op.teamID, op.id); err == nil && (sb.State == StatePaused || sb.State == StatePausing) {
		return fmt.Errorf("sandbox %q is already paused: %w", op.id, errdefs.ErrConflict)
	}
	return nil
}

// persistPausing moves the running sandbox to pausing (persisted); a
// failure before the image is complete puts it back to running.
func (p *pauser) persistPausing(ctx context.Context, op *pauseOp) error {
	_, prev, err := p.recs.begin(ctx, op.teamID, op.id, StatePausing, StateRunning)
	if err != nil {
		return err
	}
	op.prev = prev
	op.undo.Add(StepPersistPausing, func(ctx context.Context) error { p.recs.rollback(ctx, prev); return nil })
	p.inst.fault("pause:persisted")
	return nil
}

// pauseMeter meters the usage up to the pause.
func (p *pauser) pauseMeter(ctx context.Context, op *pauseOp) error {
	p.metering.last(ctx, op.prev)
	return nil
}

// pauseThaw unfreezes a sandbox the idle policy froze: the checkpoint
// needs its processes runnable.
func (p *pauser) pauseThaw(ctx context.Context, op *pauseOp) error { return p.thaw(ctx, op.id) }

// pauseCheckpoint writes the image (memory, or the files only). Once it
// is complete the pause cannot be undone: a record still saying pausing
// is finished by Reconcile, which finds the image.
func (p *pauser) pauseCheckpoint(ctx context.Context, op *pauseOp) error {
	if err := op.ck.Checkpoint(ctx, op.id, runtime.CheckpointOptions{FilesystemOnly: !op.memory}); err != nil {
		p.log.Error("pause failed; sandbox keeps running", "sandbox", op.id, "err", err)
		return fmt.Errorf("sandbox %s: pause: %w", op.id, err)
	}
	op.undo.Release()
	p.inst.fault("pause:checkpointed")
	return nil
}

// persistPaused records the pause and the lifetime left to give back on
// resume (none after an expiry pause: a resume gets the original one).
func (p *pauser) persistPaused(ctx context.Context, op *pauseOp) error {
	now := time.Now().UTC()
	_, err := p.recs.commit(ctx, op.id, func(sb *Sandbox) {
		sb.State = StatePaused
		sb.PausedAt = now
		sb.PausedFS = !op.memory
		sb.TimeLeft = max(op.prev.EndAt.Sub(now), 0)
		if op.expired {
			sb.TimeLeft = 0
		}
	})
	return err
}

// pauseForget drops what only a running sandbox has: metric samples and
// idle state.
func (p *pauser) pauseForget(ctx context.Context, op *pauseOp) error {
	p.forget(op.id)
	return nil
}

// resumeMemory restores a paused sandbox from its memory image, in place.
func resumeMemory() pipeline {
	kept := func(*starter, context.Context, *build) error { return nil }
	return coldStart().
		swap(StepReserve, "none: the paused sandbox already counts", kept).
		swap(StepResolve, "paused sandbox", (*starter).resolvePausedMemory).
		swap(StepPersistCreating, "row resuming", (*starter).persistResuming).
		swap(StepAttachNetwork, "kept", kept).
		swap(StepStart, "restore memory image", (*starter).restoreMemory).
		swap(StepInitEnvd, "kept", kept).
		swap(StepWaitReady, "kept", kept)
}

// resolvePausedMemory finds the paused sandbox a memory resume restores.
func (s *starter) resolvePausedMemory(ctx context.Context, b *build) error {
	sb, err := s.recs.Get(ctx, b.req.TeamID, b.sb.ID)
	if err != nil {
		return err
	}
	b.sb = sb
	return nil
}

// restoreMemory restores the sandbox's processes from its pause image;
// a later failure checkpoints them again, so it stays paused with memory.
func (s *starter) restoreMemory(ctx context.Context, b *build) error {
	ck, err := checkpointer(s.rt)
	if err != nil {
		return err
	}
	id := b.sb.ID
	if err := ck.Restore(ctx, runtime.Spec{ID: id}, runtime.RestoreOptions{Lazy: lazyResume(b.sb.Metadata)}); err != nil {
		return err
	}
	s.inst.fault("resume:restored")
	b.undo.Add(StepStart, func(ctx context.Context) error {
		return ck.Checkpoint(ctx, id, runtime.CheckpointOptions{})
	})
	return nil
}
