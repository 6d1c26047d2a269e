package sandbox

import (
	"context"
	"fmt"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/network"
	"github.com/agentbox/agentbox/internal/runtime"
)

// Lifecycle states beyond creating/running/killing. Every one is persisted
// before the host is touched, so a crash at any point leaves the old state
// or the new one and Reconcile knows which (see reconcileLifecycle).
const (
	StatePausing      State = "pausing"      // checkpoint in progress; still running until it completes
	StatePaused       State = "paused"       // processes are in a memory image on disk; no CPU, no RAM
	StateResuming     State = "resuming"     // restore in progress; still paused until it completes
	StateSnapshotting State = "snapshotting" // frozen for a live checkpoint; running again afterwards
)

// Lifecycle is a sandbox's timeout policy and pause bookkeeping. It is
// embedded in Sandbox, so its fields are persisted with the record.
type Lifecycle struct {
	AutoPause   bool          `json:"autoPause,omitempty"`   // pause instead of kill at the end of the lifetime
	AutoPauseFS bool          `json:"autoPauseFS,omitempty"` // that pause keeps the files only (E2B autoPauseMemory: false)
	AutoResume  bool          `json:"autoResume,omitempty"`  // data-plane traffic resumes a paused sandbox
	IdleTimeout time.Duration `json:"idleTimeout,omitempty"` // no traffic this long: pause (autoPause) or kill
	LifeTimeout time.Duration `json:"lifeTimeout,omitempty"` // the lifetime asked for at create
	PausedAt    time.Time     `json:"pausedAt,omitzero"`
	// PausedFS marks a filesystem-only pause: the resume boots fresh, and
	// traffic does not resume it (E2B refuses auto-resume there too).
	PausedFS bool `json:"pausedFS,omitempty"`
	// TimeLeft is the lifetime left when the sandbox was paused: paused
	// time does not count against the lifetime.
	TimeLeft time.Duration `json:"timeLeft,omitempty"`
	// BaseSnapshot is the snapshot whose layers the sandbox runs on (forks
	// and sandboxes created from a snapshot); it is kept while they live.
	BaseSnapshot string `json:"baseSnapshot,omitempty"`
}

// LifecycleRequest is the lifecycle part of a create call.
type LifecycleRequest struct {
	AutoPause   bool
	AutoPauseFS bool
	AutoResume  bool
	IdleTimeout time.Duration
}

func (r LifecycleRequest) apply(timeout time.Duration) Lifecycle {
	return Lifecycle{AutoPause: r.AutoPause, AutoPauseFS: r.AutoPause && r.AutoPauseFS, AutoResume: r.AutoResume, IdleTimeout: r.IdleTimeout, LifeTimeout: timeout}
}

// LifecycleConfig enables pause/resume, snapshots, forks and warm pools.
type LifecycleConfig struct {
	// SnapshotDir holds snapshots (<dir>/<id>/{snapshot.json,upper,image}).
	SnapshotDir string
	// IdleFreeze freezes (cgroup freezer, memory kept) a running sandbox
	// that had no data-plane traffic for this long; traffic thaws it in
	// milliseconds. 0 disables.
	IdleFreeze time.Duration
	// Pools maps template references to the minimum number of warm
	// sandboxes kept ready; PoolMax caps the adaptive size of each.
	Pools   map[string]int
	PoolMax int
	// FaultStep kills the process right after the named step
	// ("<operation>/<step>", crash.go) of an operation, for the
	// crash-safety tests; "" never.
	FaultStep string
}

// lifecycle is the manager's lifecycle settings and snapshot store, fixed
// at New (Options.Lifecycle).
type lifecycle struct {
	cfg   LifecycleConfig
	snaps *snapshotStore // nil: no snapshot dir
}

// checkpointer is rt's pause and restore, if it has them and they work
// on this host.
func checkpointer(rt runtime.Runtime) (runtime.Checkpointer, error) {
	ck, ok := rt.(runtime.Checkpointer)
	if !ok {
		return nil, fmt.Errorf("this runtime cannot pause sandboxes: %w", errdefs.ErrUnavailable)
	}
	if s, ok := rt.(runtime.CheckpointProber); ok {
		if err := s.CheckpointSupported(); err != nil {
			return nil, fmt.Errorf("pausing sandboxes: %w", err)
		}
	}
	return ck, nil
}

// listable says which states the list endpoints show.
func listable(s State) bool {
	switch s {
	case StateRunning, StatePausing, StatePaused, StateResuming, StateSnapshotting:
		return true
	}
	return false
}

// Paused reports whether the state is shown as "paused" to clients.
func (s State) Paused() bool { return s == StatePaused || s == StateResuming }

// killable checks that sb may be killed now (m.mu held).
func killable(sb *Sandbox) error {
	switch sb.State {
	case StateRunning, StatePaused:
		return nil
	case StateKilling, StateCreating:
		return notFound(sb.ID)
	}
	return fmt.Errorf("sandbox %q is %s; retry in a moment: %w", sb.ID, sb.State, errdefs.ErrConflict)
}

func conflict(id string, st State) error {
	return fmt.Errorf("sandbox %q is %s: %w", id, st, errdefs.ErrConflict)
}

// begin moves the team's sandbox from one of from to state to under the
// lock and persists it. It returns the record to restore if the transition
// fails.
func (m *Manager) begin(ctx context.Context, teamID, id string, to State, from ...State) (sb *Sandbox, prev *Sandbox, err error) {
	m.mu.Lock()
	sb, ok := m.sandboxes[id]
	if !ok || !visibleTo(sb, teamID) || sb.TeamID == poolTeam || sb.BuildID != "" || sb.State == StateKilling || sb.State == StateCreating {
		m.mu.Unlock()
		return nil, nil, notFound(id)
	}
	okFrom := false
	for _, f := range from {
		okFrom = okFrom || sb.State == f
	}
	if !okFrom {
		st := sb.State
		m.mu.Unlock()
		return nil, nil, conflict(id, st)
	}
	prev = clone(sb)
	sb.State = to
	rec := clone(sb)
	m.mu.Unlock()
	if err := m.rows.save(ctx, rec); err != nil {
		m.rollback(ctx, prev)
		return nil, nil, err
	}
	return rec, prev, nil
}

// commit applies f to the live sandbox under the lock and persists it.
func (m *Manager) commit(ctx context.Context, id string, f func(*Sandbox)) (*Sandbox, error) {
	m.mu.Lock()
	sb, ok := m.sandboxes[id]
	if !ok {
		m.mu.Unlock()
		return nil, notFound(id)
	}
	f(sb)
	rec := clone(sb)
	m.mu.Unlock()
	return rec, m.rows.save(ctx, rec)
}

// rollback puts a sandbox back to its record before a failed transition.
func (m *Manager) rollback(ctx context.Context, prev *Sandbox) {
	m.mu.Lock()
	if sb, ok := m.sandboxes[prev.ID]; ok {
		*sb = *clone(prev)
	}
	m.mu.Unlock()
	if err := m.rows.save(ctx, prev); err != nil {
		m.log.Error("persist rollback", "sandbox", prev.ID, "err", err)
	}
}

// Pause checkpoints the team's running sandbox to disk with its memory: its
// processes stop, it holds no CPU or RAM, and Resume brings it back with the
// same id, token, files, env and processes (pids included).
func (m *Manager) Pause(ctx context.Context, teamID, id string) error {
	return m.pauser.pause(ctx, teamID, id, false, true)
}

// Resume restores the team's paused sandbox and gives it at least timeout
// to live (or the lifetime it had left, or its original one). It reports
// whether the sandbox was paused; a running one is returned as is. auto
// marks a resume caused by traffic, which needs the sandbox's autoResume.
func (m *Manager) Resume(ctx context.Context, teamID, id string, timeout time.Duration, auto bool) (*Sandbox, bool, error) {
	return m.pauser.resume(ctx, teamID, id, timeout, auto, true)
}

// resumed sets a resumed sandbox's lifetime: at least timeout, or the
// lifetime it had left, or its original one.
func resumed(sb *Sandbox, timeout time.Duration) {
	life := max(timeout, sb.TimeLeft)
	if life <= 0 {
		life = max(sb.LifeTimeout, time.Minute)
	}
	sb.State = StateRunning
	sb.EndAt = time.Now().UTC().Add(life)
	sb.PausedAt, sb.TimeLeft, sb.PausedFS = time.Time{}, 0, false
}

// reconcileLifecycle settles a record found at start. It returns true when
// it adopted or removed the sandbox itself; otherwise the record (possibly
// rewritten to running) goes through the normal adoption.
func (m *Manager) reconcileLifecycle(ctx context.Context, sb *Sandbox, adopted map[string]bool) bool {
	ck, ckErr := checkpointer(m.rt)
	// The image first: its check settles a restore the crash interrupted
	// (runtime.Checkpointer), which the state then reflects.
	hasImage := false
	if ckErr == nil {
		hasImage, _ = ck.HasCheckpoint(ctx, sb.ID)
	}
	st, stErr := m.rt.State(ctx, sb.ID)
	// A freeze (idle, snapshot) interrupted by the crash: thaw.
	if stErr == nil && st == runtime.StatusPaused && ckErr == nil {
		if err := ck.Thaw(ctx, sb.ID); err == nil {
			st = runtime.StatusRunning
		}
	}
	running := stErr == nil && st == runtime.StatusRunning
	if sb.TeamID == poolTeam && !m.pools.configured(ctx, sb.TemplateID) {
		// Its pool is no longer configured: drain it.
		sb.State = StateKilling
		_ = m.destroy(ctx, sb, "warm pool no longer configured")
		return true
	}
	switch sb.State {
	case StateRunning:
		if hasImage && running { // resumed, image not yet removed
			_ = ck.DropCheckpoint(ctx, sb.ID)
		}
		return false
	case StatePausing, StateResuming, StateSnapshotting:
		// Old state or new state, never half: a live container means the
		// checkpoint did not happen (or the restore did); a complete image
		// without a container means the sandbox is paused.
		switch {
		case running:
			m.log.Warn("interrupted transition: sandbox is running", "sandbox", sb.ID, "was", sb.State)
			if hasImage {
				_ = ck.DropCheckpoint(ctx, sb.ID)
			}
			if sb.State == StateResuming {
				sb.EndAt = time.Now().UTC().Add(max(sb.TimeLeft, sb.LifeTimeout, time.Minute))
				sb.PausedAt, sb.TimeLeft = time.Time{}, 0
			}
			sb.State = StateRunning
		case hasImage:
			m.log.Warn("interrupted transition: sandbox is paused", "sandbox", sb.ID, "was", sb.State)
			if sb.State == StatePausing {
				sb.PausedAt = time.Now().UTC()
				sb.TimeLeft = max(time.Until(sb.EndAt), 0)
			}
			sb.State = StatePaused
		default:
			return false // neither: the normal path removes it
		}
		if err := m.rows.save(ctx, sb); err != nil {
			m.log.Error("persist reconciled state", "sandbox", sb.ID, "err", err)
		}
		if sb.State == StateRunning {
			return false
		}
		fallthrough
	case StatePaused:
		reason := ""
		if !hasImage {
			reason = "its pause image is missing"
		} else if _, ok := m.net.Lookup(sb.ID); !ok {
			reason = "its network namespace is gone"
		} else if err := m.net.SetPolicy(ctx, sb.ID, network.Policy{AllowInternet: sb.AllowInternet}); err != nil {
			reason = "could not restore its egress policy: " + err.Error()
		}
		if reason != "" {
			m.log.Warn("removing paused sandbox after restart", "sandbox", sb.ID, "why", reason)
			sb.State = StateKilling
			_ = m.destroy(ctx, sb, reason)
			return true
		}
		m.mu.Lock()
		m.sandboxes[sb.ID] = sb
		m.mu.Unlock()
		adopted[sb.ID] = true
		m.log.Info("paused sandbox re-adopted", "sandbox", sb.ID)
		return true
	}
	return false
}

// WakeIf is the gateway's lookup: it returns the running sandbox, thawing a
// frozen one and resuming a paused one whose autoResume is on. live is ctx,
// also cancelled when the sandbox is removed, so traffic to a killed
// sandbox ends at once instead of waiting on a peer that can no longer
// answer. done ends the request's activity (a sandbox with requests in
// flight is not idle) and releases live. check sees the sandbox's record in whatever state it is and runs before anything wakes
// it, so a request the gateway refuses (a wrong access token) never
// resumes or thaws a sandbox. A nil check passes everything.
func (m *Manager) WakeIf(ctx context.Context, id string, check func(*Sandbox) bool) (*Sandbox, context.Context, func(), bool) {
	return m.reaper.wakeIf(ctx, id, check)
}
