package sandbox

import (
	"context"
	"fmt"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/template"
)

// Quota caps what one team's creates may ask for. Config.Quota is the
// server's default; a team's stored quota (store.TeamQuota) overrides it
// field by field, and is read at every create so an operator's change
// applies to the next one without a restart.
type Quota struct {
	Limits
	// MaxSandboxes is the most sandboxes the team may have at once: running,
	// paused or being created; a template build in progress counts as one.
	// 0 = no cap.
	MaxSandboxes int
	// MaxBuilds is the most template builds the team may run at once.
	// 0 = no cap.
	MaxBuilds int
}

// DefaultMaxBuilds is the server's default for Quota.MaxBuilds: a build
// runs package installs and compilers, so a few at once per team.
const DefaultMaxBuilds = 2

// DefaultQuota is the quota when Config.Quota is zero.
func DefaultQuota() Quota {
	return Quota{Limits: Limits{CPUCount: 8, MemoryMB: 16384, DiskMB: 51200, PIDs: 32768, TmpMB: 8192}, MaxBuilds: DefaultMaxBuilds}
}

// teamQuota is the team's stored quota over the server's default.
func (a *admission) teamQuota(ctx context.Context, teamID string) (Quota, error) {
	q := a.quota
	tq, ok, err := a.quotas.TeamQuota(ctx, teamID)
	if err != nil || !ok {
		return q, err
	}
	for _, f := range []struct {
		dst *int
		v   int
	}{
		{&q.CPUCount, tq.CPUCount}, {&q.MemoryMB, tq.MemoryMB}, {&q.DiskMB, tq.DiskMB},
		{&q.PIDs, tq.PIDs}, {&q.TmpMB, tq.TmpMB}, {&q.MaxSandboxes, tq.MaxSandboxes},
		{&q.MaxBuilds, tq.MaxBuilds},
	} {
		if f.v > 0 {
			*f.dst = f.v
		}
	}
	return q, nil
}

// quotaOf is teamQuota for messages: a store error falls back to the
// server's default rather than losing the message.
func (a *admission) quotaOf(ctx context.Context, teamID string) Quota {
	q, err := a.teamQuota(ctx, teamID)
	if err != nil {
		a.log.Warn("read team quota", "team", teamID, "err", err)
	}
	return q
}

// teamUseLocked counts what holds one of teamID's maxSandboxes: its
// sandboxes (not those being killed), creates in flight and template builds
// in progress, one each whatever steps they run (the sandbox of a build's RUN
// step is its build's, not one more); builds is how many of n are builds.
// a.mu is held.
func (a *admission) teamUseLocked(teamID string) (n, builds int) {
	for _, t := range a.builds {
		if t == teamID {
			builds++
		}
	}
	// Killing ones are on their way out; the client already let go.
	n = a.reserved[teamID] + builds + a.held(teamID, func(buildID string) bool { return a.builds[buildID] == teamID })
	return n, builds
}

// teamHeld counts teamID's sandboxes in recs that hold one of its
// maxSandboxes: not those being killed, nor those of a build for which
// inBuild reports true (the build holds one already). It takes the
// records' lock (admission.held).
func teamHeld(recs records, teamID string, inBuild func(buildID string) bool) int {
	n := 0
	recs.each(func(sb *Sandbox) {
		if sb.TeamID != teamID || sb.State == StateKilling || sb.BuildID != "" && inBuild(sb.BuildID) {
			return
		}
		n++
	})
	return n
}

// fullError is the maxSandboxes refusal: what the team holds and how to
// make room or raise the quota.
func fullError(n, builds, limit int) error {
	held := fmt.Sprintf("%d sandbox(es) running, paused or starting", n)
	if builds > 0 {
		held = fmt.Sprintf("%d sandbox(es) running, paused or starting (%d of them template builds in progress, which count as one each)", n, builds)
	}
	return fmt.Errorf("maxSandboxes: the team already has %s, and its quota allows %d at once; "+
		"kill one it no longer needs (DELETE /sandboxes/{id} or `agentbox kill <id>`; pausing does not free room, paused sandboxes count too), "+
		"wait for a build to finish, or ask the server's operator to raise the quota (`agentbox team quota set <team> --max-sandboxes N`): %w",
		held, limit, errdefs.ErrResourceExhausted)
}

// reserveSandbox counts one more sandbox against the team's maxSandboxes
// until release, which the caller runs once the sandbox is in m.sandboxes
// (or has failed): concurrent creates cannot all slip under the cap.
func (a *admission) reserveSandbox(teamID string, q Quota) (release func(), err error) {
	if q.MaxSandboxes <= 0 || teamID == poolTeam {
		return func() {}, nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if n, builds := a.teamUseLocked(teamID); n >= q.MaxSandboxes {
		return nil, fullError(n, builds, q.MaxSandboxes)
	}
	a.reserved[teamID]++
	var once bool
	return func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		if once {
			return
		}
		once = true
		if a.reserved[teamID]--; a.reserved[teamID] <= 0 {
			delete(a.reserved, teamID)
		}
	}, nil
}

// AdmitBuild counts template build a.BuildID of a.TeamID against the
// team's quota until release: one of its maxBuilds and one of its
// maxSandboxes for the whole build, whatever it is doing (pulling a base,
// copying files, running a step). The sizes the build asks for are checked
// against the team's quota now, so an impossible build is refused before it
// starts. The build's RUN steps (RunSteps) run in its slot. The admission
// lives in memory: a restart fails the builds it interrupted and frees
// their slots with them. Release may be called more than once.
func (m *Manager) AdmitBuild(ctx context.Context, a template.BuildAdmission) (release func(), err error) {
	return m.admission.admitBuild(ctx, a)
}

func (ad *admission) admitBuild(ctx context.Context, a template.BuildAdmission) (release func(), err error) {
	switch {
	case a.TeamID == "" || a.TeamID == poolTeam:
		return nil, fmt.Errorf("TeamID: a build runs under its team's quota: %w", errdefs.ErrInvalidArgument)
	case a.BuildID == "":
		return nil, fmt.Errorf("BuildID: required: %w", errdefs.ErrInvalidArgument)
	}
	q, err := ad.teamQuota(ctx, a.TeamID)
	if err != nil {
		return nil, err
	}
	if _, err := resolveLimits(Limits{CPUCount: a.CPUCount, MemoryMB: a.MemoryMB, PIDs: capAt(DefaultPIDs, q.PIDs)}, &template.Template{}, q); err != nil {
		return nil, err
	}
	ad.mu.Lock()
	defer ad.mu.Unlock()
	if _, ok := ad.builds[a.BuildID]; ok {
		return nil, fmt.Errorf("build %s is running already: %w", a.BuildID, errdefs.ErrConflict)
	}
	n, builds := ad.teamUseLocked(a.TeamID)
	if q.MaxBuilds > 0 && builds >= q.MaxBuilds {
		return nil, fmt.Errorf("maxBuilds: the team already runs %d template build(s), and its quota allows %d at once; "+
			"wait for one to finish (GET /templates/{templateID}/builds/{buildID}/status) or ask the server's operator to raise the quota "+
			"(`agentbox team quota set <team> --max-builds N`): %w", builds, q.MaxBuilds, errdefs.ErrResourceExhausted)
	}
	if q.MaxSandboxes > 0 && n >= q.MaxSandboxes {
		return nil, fmt.Errorf("a template build runs as one of the team's sandboxes: %w", fullError(n, builds, q.MaxSandboxes))
	}
	ad.builds[a.BuildID] = a.TeamID
	var once bool
	return func() {
		ad.mu.Lock()
		defer ad.mu.Unlock()
		if !once {
			once = true
			delete(ad.builds, a.BuildID)
		}
	}, nil
}

// buildAdmitted reports whether build buildID of teamID holds a slot
// (AdmitBuild): its step sandboxes then take no other.
func (a *admission) buildAdmitted(teamID, buildID string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return teamID != "" && a.builds[buildID] == teamID
}
