package sandbox

import (
	"context"
	"errors"
	"iter"
	"log/slog"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
)

// reaper is the manager's clock and the data plane's waker: at each tick it
// kills expired sandboxes, runs auto-pause, idle timeouts and idle freezes,
// sizes the warm pools and collects snapshots; on traffic it thaws or
// resumes a sandbox. It decides inside the records' lock, reached through
// recs (each, one, all), and acts outside it; the idle state and the pools
// have their own locks, taken after the records' (lock order: records,
// then idle or pools).
type reaper struct {
	log        *slog.Logger
	rt         runtime.Runtime
	recs       records
	idle       *idleState
	pools      *WarmPools
	pauser     *pauser
	maxTimeout time.Duration
	idleFreeze time.Duration // LifecycleConfig.IdleFreeze; 0: never
	create     func(ctx context.Context, req CreateRequest) (*Sandbox, error)
	// snapshotsTick collects snapshots (snapshots.tick).
	snapshotsTick func(ctx context.Context)
}

func (r *reaper) reap(ctx context.Context) {
	now := time.Now()
	// Auto-pause and idle timeouts first: they take their sandboxes out of
	// the running state before the kill loop below looks (lifecycle.go).
	r.reapLifecycle(ctx, now)
	var expired []*Sandbox
	r.recs.each(func(sb *Sandbox) {
		if sb.State == StateRunning && now.After(sb.EndAt) {
			sb.State = StateKilling
			expired = append(expired, clone(sb))
		}
	})
	for _, sb := range expired {
		go func() {
			if err := r.recs.discard(ctx, sb, "timeout expired"); err != nil {
				r.log.Error("reap", "sandbox", sb.ID, "err", err)
			}
		}()
	}
}

// reapLifecycle runs every reap tick: auto-pause at the end of the
// lifetime, idle timeouts, idle freezing, and the warm pools.
func (r *reaper) reapLifecycle(ctx context.Context, now time.Time) {
	type action struct {
		id   string
		what string
		fs   bool // pause without memory
	}
	var todo []action
	r.recs.each(func(sb *Sandbox) {
		id := sb.ID
		if sb.State != StateRunning || sb.TeamID == poolTeam || sb.BuildID != "" {
			return
		}
		idle, inflight := r.idle.idle(id, now)
		switch {
		case sb.AutoPause && now.After(sb.EndAt):
			// Out of the kill loop's reach while the pause runs; a failed
			// pause kills it at the next tick.
			sb.EndAt = now.Add(time.Minute)
			todo = append(todo, action{id, "expire", sb.AutoPauseFS})
		case sb.IdleTimeout > 0 && !inflight && idle > sb.IdleTimeout:
			if sb.AutoPause {
				todo = append(todo, action{id, "pause", sb.AutoPauseFS})
			} else {
				sb.State = StateKilling
				todo = append(todo, action{id, "kill", false})
			}
		case r.idleFreeze > 0 && r.idle.freezeIfIdle(id, now, r.idleFreeze):
			todo = append(todo, action{id, "freeze", false})
		}
	})
	for _, a := range todo {
		go func() {
			var err error
			switch a.what {
			case "expire":
				if err = r.pauser.pause(ctx, "", a.id, true, !a.fs); err != nil && !errors.Is(err, errdefs.ErrConflict) {
					r.recs.one(a.id, func(sb *Sandbox) {
						if sb.State == StateRunning {
							sb.AutoPause = false // kill it at the next tick
							sb.EndAt = time.Now()
						}
					})
				}
			case "pause":
				err = r.pauser.pause(ctx, "", a.id, false, !a.fs)
			case "kill":
				var sb *Sandbox
				r.recs.one(a.id, func(cur *Sandbox) { sb = clone(cur) })
				if sb != nil {
					err = r.recs.discard(ctx, sb, "idle timeout")
				}
			case "freeze":
				if ck, cerr := checkpointer(r.rt); cerr != nil {
					err = cerr
				} else if err = ck.Freeze(ctx, a.id); err != nil {
					r.idle.thawed(a.id)
				}
			}
			if err != nil && !errors.Is(err, errdefs.ErrConflict) {
				r.log.Warn("lifecycle timeout action", "sandbox", a.id, "action", a.what, "err", err)
			}
		}()
	}
	r.poolTick(ctx, now)
	r.snapshotsTick(ctx)
}

// thaw unfreezes a sandbox frozen by the idle policy.
func (r *reaper) thaw(ctx context.Context, id string) error {
	if !r.idle.frozen(id) {
		return nil
	}
	ck, err := checkpointer(r.rt)
	if err != nil {
		return err
	}
	if err := ck.Thaw(ctx, id); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return err
	}
	r.idle.thawed(id)
	return nil
}

// wakeIf is Manager.WakeIf: check runs on the record before anything
// wakes the sandbox.
func (r *reaper) wakeIf(ctx context.Context, id string, check func(*Sandbox) bool) (*Sandbox, context.Context, func(), bool) {
	sb, end, ok := r.wake(ctx, id, check)
	if !ok {
		return nil, nil, nil, false
	}
	var life sandboxLife
	if !r.recs.one(id, func(*Sandbox) { life = r.idle.life(id) }) {
		end() // removed meanwhile: no life to tie the traffic to
		return nil, nil, nil, false
	}
	live, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(life.ctx, cancel)
	return sb, live, func() { stop(); cancel(); end() }, true
}

func (r *reaper) wake(ctx context.Context, id string, check func(*Sandbox) bool) (*Sandbox, func(), bool) {
	var rec *Sandbox
	r.recs.one(id, func(sb *Sandbox) {
		if sb.TeamID != poolTeam && sb.BuildID == "" {
			rec = clone(sb)
		}
	})
	if rec == nil {
		return nil, nil, false
	}
	if check != nil && !check(rec) {
		return nil, nil, false
	}
	switch rec.State {
	case StateRunning:
		if err := r.thaw(ctx, id); err != nil {
			r.log.Warn("thaw on traffic", "sandbox", id, "err", err)
			return nil, nil, false
		}
	case StatePaused, StatePausing, StateResuming:
		if _, _, err := r.pauser.resume(ctx, "", id, 0, true, true); err != nil {
			return nil, nil, false
		}
	default:
		return nil, nil, false
	}
	r.idle.touch(id)
	var out *Sandbox
	var end func()
	r.recs.one(id, func(sb *Sandbox) {
		if sb.State == StateRunning {
			// Counted under the records' lock: the reaper decides an idle
			// timeout under it.
			out, end = clone(sb), r.idle.request(id)
		}
	})
	if out == nil {
		return nil, nil, false
	}
	return out, end, true
}

// poolTick resolves configured pools, resizes them to the create rate and
// starts refills. Called from the reaper (no lock held).
func (r *reaper) poolTick(ctx context.Context, now time.Time) {
	if !r.pools.enabled() {
		return
	}
	r.pools.resolve(ctx)

	var trim []*Sandbox
	var fills []poolFill
	r.recs.all(func(live iter.Seq[*Sandbox]) {
		ready := map[string]int{}
		for sb := range live {
			if sb.TeamID != poolTeam || sb.State != StateRunning {
				continue
			}
			if sb.Health != "" {
				// The health check found it broken: a claim would wait for
				// it in vain. It goes, and the pool refills.
				sb.State = StateKilling
				trim = append(trim, clone(sb))
				continue
			}
			ready[sb.TemplateID]++
		}
		var targets map[string]int
		fills, targets = r.pools.plan(now, ready)
		for id, target := range targets {
			// Demand fell: the surplus goes, a few at a time.
			trimmed := 0
			for sb := range live {
				if trimmed >= poolTrimPerTick || ready[id] <= target {
					break
				}
				if claimable(sb) && sb.TemplateID == id {
					trimmed++
					sb.State = StateKilling // hidden from claims from here on
					ready[id]--
					trim = append(trim, clone(sb))
				}
			}
		}
	})
	for _, sb := range trim {
		go func() {
			if err := r.recs.discard(ctx, sb, "warm pool above its size"); err != nil {
				r.log.Warn("warm pool trim", "sandbox", sb.ID, "err", err)
			}
		}()
	}
	for _, f := range fills {
		for range f.n {
			go func() {
				_, err := r.create(context.WithoutCancel(ctx), CreateRequest{
					TeamID: poolTeam, Template: f.templateID, Timeout: r.maxTimeout, Secure: true, AllowInternet: true,
				})
				r.pools.filled(f.templateID)
				if err != nil {
					r.log.Warn("warm pool refill", "template", f.templateID, "err", err)
				}
			}()
		}
	}
}
