package sandbox

import (
	"context"
	"time"

	"github.com/agentbox/agentbox/internal/runtime"
)

// PauseFilesystem pauses the team's running sandbox keeping only its files
// (E2B's pause with memory: false): every process stops, the writable layer
// stays on disk, and a resume boots the sandbox fresh on it, with the same
// id, token, env and files but none of the old processes. Traffic does not
// resume such a sandbox; connect does.
func (m *Manager) PauseFilesystem(ctx context.Context, teamID, id string) error {
	return m.pauser.pause(ctx, teamID, id, false, false)
}

// ResumeFromFiles resumes the team's paused sandbox from its files only
// (E2B's connect with memory: false): a memory image, if any, is dropped.
func (m *Manager) ResumeFromFiles(ctx context.Context, teamID, id string, timeout time.Duration) (*Sandbox, bool, error) {
	return m.pauser.resume(ctx, teamID, id, timeout, false, false)
}

// CreateFilesystemSnapshot snapshots the team's running sandbox's files
// only (its writable layer, copied while it is frozen for that instant).
// Sandboxes created from it boot fresh: no memory, new processes.
func (t *Snapshotter) CreateFilesystemSnapshot(ctx context.Context, teamID, id, name string) (*Snapshot, error) {
	return t.snapshot(ctx, teamID, id, name, false, false)
}

// resolvePaused finds the paused sandbox a files-only resume boots, and
// what its fresh envd needs: the template's start and ready commands (a code
// interpreter's kernels start again) and its egress policy.
func (s *starter) resolvePaused(ctx context.Context, b *build) error {
	sb, err := s.recs.Get(ctx, b.req.TeamID, b.sb.ID)
	if err != nil {
		return err
	}
	b.sb = sb
	b.startup, b.ready = s.templateCommands(ctx, sb)
	b.pol, err = s.policies.of(ctx, sb)
	return err
}

// persistResuming moves the paused sandbox to resuming (persisted); a
// failure later puts it back to paused.
func (s *starter) persistResuming(ctx context.Context, b *build) error {
	rec, prev, err := s.recs.begin(ctx, b.req.TeamID, b.sb.ID, StateResuming, StatePaused)
	if err != nil {
		return err
	}
	b.prev = prev
	b.undo.Add(StepPersistCreating, func(ctx context.Context) error { s.recs.rollback(ctx, b.prev); return nil })
	s.inst.fault("resume:persisted")
	sb := clone(rec)
	resumed(sb, b.req.Timeout)
	sb.State = StateResuming
	b.sb = sb
	return nil
}

// bootFiles boots the paused sandbox fresh, in place, on its writable
// layer; a memory image, if any, is ignored (dropped once running).
func (s *starter) bootFiles(ctx context.Context, b *build) error {
	ck, err := checkpointer(s.rt)
	if err != nil {
		return err
	}
	id := b.sb.ID
	b.sb.BootID = runtime.NewBootID()
	if err := ck.Restore(ctx, runtime.Spec{ID: id, BootID: b.sb.BootID}, runtime.RestoreOptions{FilesystemOnly: true}); err != nil {
		return err
	}
	s.inst.fault("resume:restored")
	b.undo.Add(StepStart, func(ctx context.Context) error {
		// Stopped again, it is paused on its files only: the memory image
		// no longer matches them.
		b.prev.PausedFS = true
		return ck.Checkpoint(ctx, id, runtime.CheckpointOptions{FilesystemOnly: true})
	})
	return nil
}
