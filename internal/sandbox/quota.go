package sandbox

import (
	"context"
	"fmt"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// Quota caps what one team's creates may ask for. Config.Quota is the
// server's default; a team's stored quota (store.TeamQuota) overrides it
// field by field, and is read at every create so an operator's change
// applies to the next one without a restart.
type Quota struct {
	Limits
	// MaxSandboxes is the most sandboxes the team may have at once: running,
	// paused or being created. 0 = no cap.
	MaxSandboxes int
}

// DefaultQuota is the quota when Config.Quota is zero.
func DefaultQuota() Quota {
	return Quota{Limits: Limits{CPUCount: 8, MemoryMB: 16384, DiskMB: 51200, PIDs: 32768, TmpMB: 8192}}
}

// teamQuota is the team's stored quota over the server's default.
func (m *Manager) teamQuota(ctx context.Context, teamID string) (Quota, error) {
	q := m.cfg.Quota
	tq, ok, err := m.store.TeamQuota(ctx, teamID)
	if err != nil || !ok {
		return q, err
	}
	for _, f := range []struct {
		dst *int
		v   int
	}{
		{&q.CPUCount, tq.CPUCount}, {&q.MemoryMB, tq.MemoryMB}, {&q.DiskMB, tq.DiskMB},
		{&q.PIDs, tq.PIDs}, {&q.TmpMB, tq.TmpMB}, {&q.MaxSandboxes, tq.MaxSandboxes},
	} {
		if f.v > 0 {
			*f.dst = f.v
		}
	}
	return q, nil
}

// quotaOf is teamQuota for messages: a store error falls back to the
// server's default rather than losing the message.
func (m *Manager) quotaOf(ctx context.Context, teamID string) Quota {
	q, err := m.teamQuota(ctx, teamID)
	if err != nil {
		m.log.Warn("read team quota", "team", teamID, "err", err)
	}
	return q
}

// reserveSandbox counts one more sandbox against the team's maxSandboxes
// until release, which the caller runs once the sandbox is in m.sandboxes
// (or has failed): concurrent creates cannot all slip under the cap.
func (m *Manager) reserveSandbox(teamID string, q Quota) (release func(), err error) {
	if q.MaxSandboxes <= 0 || teamID == poolTeam {
		return func() {}, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	n := m.life.reserved[teamID]
	for _, sb := range m.sandboxes {
		// Killing ones are on their way out; the client already let go.
		if sb.TeamID == teamID && sb.State != StateKilling {
			n++
		}
	}
	if n >= q.MaxSandboxes {
		return nil, fmt.Errorf("maxSandboxes: the team already has %d sandbox(es) running, paused or starting, and its quota allows %d at once; "+
			"kill one it no longer needs (DELETE /sandboxes/{id} or `agentbox kill <id>`; pausing does not free room, paused sandboxes count too) "+
			"or ask the server's operator to raise the quota (`agentbox team quota set <team> --max-sandboxes N`): %w",
			n, q.MaxSandboxes, errdefs.ErrResourceExhausted)
	}
	if m.life.reserved == nil {
		m.life.reserved = map[string]int{}
	}
	m.life.reserved[teamID]++
	var once bool
	return func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if once {
			return
		}
		once = true
		if m.life.reserved[teamID]--; m.life.reserved[teamID] <= 0 {
			delete(m.life.reserved, teamID)
		}
	}, nil
}
