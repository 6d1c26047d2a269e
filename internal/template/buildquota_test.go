package template

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// admittingRunner is a fakeRunner that admits builds as the sandbox
// manager does, up to max at once, and records what it was asked.
type admittingRunner struct {
	*fakeRunner
	max  int
	mu   sync.Mutex
	held map[string]bool
	seen []BuildAdmission
}

func (a *admittingRunner) AdmitBuild(_ context.Context, ad BuildAdmission) (func(), error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.seen = append(a.seen, ad)
	if len(a.held) >= a.max {
		return nil, fmt.Errorf("maxBuilds: full: %w", errdefs.ErrResourceExhausted)
	}
	a.held[ad.BuildID] = true
	return func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		delete(a.held, ad.BuildID)
	}, nil
}

func (a *admittingRunner) holding() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.held)
}

// TestBuildAdmission: Start admits a build before it answers and the
// build holds its slot until it ends, whether it succeeds or fails; a
// refused build stays waiting and can be started later.
func TestBuildAdmission(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t)
	runner := &admittingRunner{fakeRunner: &fakeRunner{release: make(chan struct{}), started: make(chan struct{}, 1)}, max: 1, held: map[string]bool{}}
	b, err := NewBuilds(ctx, s, runner, nil)
	if err != nil {
		t.Fatal(err)
	}
	request := func(name string) *Job {
		j, err := b.Request(ctx, "a", BuildRequest{Name: name, CPUCount: 1, MemoryMB: 256})
		if err != nil {
			t.Fatal(err)
		}
		return j
	}
	run := func(cmd string) BuildSpec {
		return BuildSpec{From: "scratch", Steps: []Step{{Op: OpRun, Args: []string{cmd}}}}
	}
	slow, next := request("slow"), request("next")
	if err := b.Start(ctx, "a", slow.TemplateID, slow.BuildID, run("fake-block")); err != nil {
		t.Fatal(err)
	}
	<-runner.started
	if got := runner.seen[0]; got != (BuildAdmission{TeamID: "a", BuildID: slow.BuildID, CPUCount: 1, MemoryMB: 256}) {
		t.Errorf("admission %+v", got)
	}
	if err := b.Start(ctx, "a", next.TemplateID, next.BuildID, run("fake-write /x y")); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("start past the limit: %v", err)
	}
	if st, _ := b.Status(ctx, "a", next.TemplateID, next.BuildID, 0, 0, ""); st.Status != StatusWaiting {
		t.Fatalf("a refused build is %s, want waiting", st.Status)
	}
	close(runner.release)
	waitStatus(t, b, "a", slow, StatusReady)
	if n := runner.holding(); n != 0 {
		t.Fatalf("%d slot(s) held after the build ended", n)
	}
	// Started again once there is room; a failing build frees it too.
	if err := b.Start(ctx, "a", next.TemplateID, next.BuildID, run("fake-fail 2 broken")); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, b, "a", next, StatusError)
	if n := runner.holding(); n != 0 {
		t.Fatalf("%d slot(s) held after a failed build", n)
	}
}

// TestLimitErrorMessage: a RUN step that hit a limit fails naming it, not
// only its exit code.
func TestLimitErrorMessage(t *testing.T) {
	le := &LimitError{Msg: "line 3 \"make\" was killed: it used more than the team's memory quota of 512 MiB", Err: &ExitError{Line: 3, Cmd: "make", Code: 137}}
	be := &BuildError{Step: 2, Line: 3, Op: OpRun, ExitCode: 137, Output: "Killed", Err: le}
	if msg := be.Error(); !strings.Contains(msg, "memory quota of 512 MiB") || !strings.Contains(msg, "Killed") {
		t.Fatalf("message %q", msg)
	}
	if !errors.Is(be, errdefs.ErrResourceExhausted) {
		t.Error("a limit hit is not ErrResourceExhausted")
	}
	var ec interface{ ExitCode() int }
	if !errors.As(be, &ec) || ec.ExitCode() != 137 {
		t.Error("the exit code is lost")
	}
}

// TestOperatorRunnerRefusesTeams: the operator's runner, which has no
// sandbox limits, never runs a team's steps.
func TestOperatorRunnerRefusesTeams(t *testing.T) {
	err := OperatorRunner{}.RunSteps(context.Background(), StepRequest{TeamID: "a", BuildID: "b1", Layers: []string{"/"},
		Commands: []StepCommand{{Cmd: "true"}}, UpperDir: filepath.Join(t.TempDir(), "u")})
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "operator") {
		t.Fatalf("a team's step on the operator's runner: %v", err)
	}
}
