package sandbox

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// createdObserver records the start pipelines' runs.
type createdObserver struct {
	noObserver
	mu   sync.Mutex
	runs []createdRun
}

type createdRun struct {
	path  string
	ok    bool
	steps map[string]time.Duration
}

func (o *createdObserver) Created(path, _, _ string, ok bool, _ time.Duration, steps map[string]time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.runs = append(o.runs, createdRun{path, ok, steps})
}

// TestMemoryResumeIsAPipelinePath: a memory resume writes the audit event
// and the step metrics every start writes, and rolls back like one.
func TestMemoryResumeIsAPipelinePath(t *testing.T) {
	ctx := context.Background()
	e := newFakeEnv(t, LifecycleConfig{})
	obs := &createdObserver{}
	e.m.inst.obs = obs
	sb := e.create(t, e.req())
	if err := e.m.Pause(ctx, e.team, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, resumed, err := e.m.Resume(ctx, e.team, sb.ID, time.Minute, false); err != nil || !resumed {
		t.Fatalf("resume: %v %v", resumed, err)
	}
	evs := e.events(t, "resume", "allowed")
	if len(evs) != 1 || evs[0].Fields["path"] != "resume-memory" {
		t.Fatalf("resume audit events %+v; want one with path resume-memory", evs)
	}
	var run *createdRun
	for i := range obs.runs {
		if obs.runs[i].path == "resume-memory" {
			run = &obs.runs[i]
		}
	}
	if run == nil || !run.ok {
		t.Fatalf("no step metrics for the memory resume: %+v", obs.runs)
	}
	for _, s := range resumeMemory() {
		if _, ok := run.steps[s.name]; !ok {
			t.Errorf("step %q has no duration", s.name)
		}
	}
	if got, _ := e.m.Get(ctx, e.team, sb.ID); got.State != StateRunning {
		t.Fatalf("state after resume %s", got.State)
	}
}

// TestMemoryResumeRollsBackAtEveryStep fails the memory resume at each
// step: the sandbox stays paused with its memory, and can resume later.
func TestMemoryResumeRollsBackAtEveryStep(t *testing.T) {
	for _, s := range resumeMemory() {
		if s.name == StepRegister {
			continue
		}
		t.Run(s.name, func(t *testing.T) {
			ctx := context.Background()
			e := newFakeEnv(t, LifecycleConfig{})
			sb := e.create(t, e.req())
			if err := e.m.Pause(ctx, e.team, sb.ID); err != nil {
				t.Fatal(err)
			}
			boom := errors.New("injected failure")
			e.m.inst.stepHook = func(path, step string) error {
				if path == "resume-memory" && step == s.name {
					return boom
				}
				return nil
			}
			// The step's error is shown, as unavailable: the client may retry.
			if _, _, err := e.m.Resume(ctx, e.team, sb.ID, time.Minute, false); !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), boom.Error()) {
				t.Fatalf("err = %v, want the injected failure as unavailable", err)
			}
			got, _ := e.m.Get(ctx, e.team, sb.ID)
			if got.State != StatePaused || got.PausedFS {
				t.Fatalf("after failed resume: %s fs=%v; want paused with memory", got.State, got.PausedFS)
			}
			if denied := e.events(t, "resume", "denied"); len(denied) != 1 || denied[0].Fields["step"] != s.name {
				t.Fatalf("failure audit events %+v; want one naming step %q", denied, s.name)
			}
			e.m.inst.stepHook = nil
			if _, resumed, err := e.m.Resume(ctx, e.team, sb.ID, time.Minute, false); err != nil || !resumed {
				t.Fatalf("resume after the failure: %v %v", resumed, err)
			}
		})
	}
}

// TestPauseRollsBackAtEveryStep fails the pause at each step: before the
// image is complete the sandbox keeps running; after, it is paused.
func TestPauseRollsBackAtEveryStep(t *testing.T) {
	imageDone := false
	for _, s := range pauseSteps() {
		want := StateRunning
		if imageDone {
			want = StatePaused
		}
		if s.name == StepCheckpoint {
			imageDone = true
		}
		if s.name == StepPersistPaused || s.name == StepForget {
			want = StatePaused
		}
		t.Run(s.name, func(t *testing.T) {
			ctx := context.Background()
			e := newFakeEnv(t, LifecycleConfig{})
			sb := e.create(t, e.req())
			boom := errors.New("injected failure")
			var seen []string
			e.m.inst.stepHook = func(path, step string) error {
				if path == "pause" {
					seen = append(seen, step)
				}
				if path == "pause" && step == s.name {
					return boom
				}
				return nil
			}
			if err := e.m.Pause(ctx, e.team, sb.ID); !errors.Is(err, boom) {
				t.Fatalf("err = %v, want the injected failure", err)
			}
			if seen[len(seen)-1] != s.name {
				t.Fatalf("steps seen %v", seen)
			}
			if got, _ := e.m.Get(ctx, e.team, sb.ID); got.State != want && !(s.name == StepCheckpoint && got.State == StatePausing) {
				t.Fatalf("state after a failure at %q: %s, want %s", s.name, got.State, want)
			}
		})
	}
}
