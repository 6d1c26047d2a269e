package sandbox

import (
	"context"
	"fmt"
	"time"
)

// PauseFilesystem pauses the team's running sandbox keeping only its files
// (E2B's pause with memory: false): every process stops, the writable layer
// stays on disk, and a resume boots the sandbox fresh on it, with the same
// id, token, env and files but none of the old processes. Traffic does not
// resume such a sandbox; connect does.
func (m *Manager) PauseFilesystem(ctx context.Context, teamID, id string) error {
	return m.pause(ctx, teamID, id, false, false)
}

// ResumeFromFiles resumes the team's paused sandbox from its files only
// (E2B's connect with memory: false): a memory image, if any, is dropped.
func (m *Manager) ResumeFromFiles(ctx context.Context, teamID, id string, timeout time.Duration) (*Sandbox, bool, error) {
	return m.resume(ctx, teamID, id, timeout, false, false)
}

// CreateFilesystemSnapshot snapshots the team's running sandbox's files
// only (its writable layer, copied while it is frozen for that instant).
// Sandboxes created from it boot fresh: no memory, new processes.
func (m *Manager) CreateFilesystemSnapshot(ctx context.Context, teamID, id, name string) (*Snapshot, error) {
	return m.snapshot(ctx, teamID, id, name, false, false)
}

// bootInit initialises the envd of a sandbox booted fresh on its files, as
// a create does: env, user, token, and the template's start and ready
// commands (a code interpreter's kernels start again).
func (m *Manager) bootInit(ctx context.Context, sb *Sandbox) error {
	tplID := sb.TemplateID
	if sb.BaseSnapshot != "" && m.life.snaps != nil {
		if snap, err := m.life.snaps.load(sb.BaseSnapshot); err == nil {
			tplID = snap.TemplateID
		}
	}
	startCmd, readyCmd := "", ""
	if tpl, err := m.templates.Get(ctx, tplID); err == nil {
		startCmd, readyCmd = tpl.StartCmd, tpl.ReadyCmd
	} else {
		m.log.Warn("fresh boot without the template's start command", "sandbox", sb.ID, "template", tplID, "err", err)
	}
	pol, err := m.policyOf(ctx, sb)
	if err != nil {
		return err
	}
	if err := m.initEnvd(ctx, sb, startCmd, pol); err != nil {
		return fmt.Errorf("envd did not start: %w", err)
	}
	return m.waitReady(ctx, sb, readyCmd)
}
