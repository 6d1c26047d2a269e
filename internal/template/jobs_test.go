package template

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
)

func waitStatus(t *testing.T, b *Builds, team string, j *Job, want string) *BuildStatus {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; {
		st, err := b.Status(context.Background(), team, j.TemplateID, j.BuildID, 0, 0, "")
		if err != nil {
			t.Fatal(err)
		}
		if st.Status == want {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("build %s is %s, want %s: %+v", j.BuildID, st.Status, want, st.Reason)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestBuildJobs: jobs belong to their team, and a restart fails the
// builds in flight with a reason while keeping their status and logs.
func TestBuildJobs(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t)
	runner := &fakeRunner{release: make(chan struct{}), started: make(chan struct{}, 1)}
	b, err := NewBuilds(ctx, s, runner, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Request(ctx, "a", BuildRequest{Name: "base"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a team build named base: %v", err)
	}
	ok, err := b.Request(ctx, "a", BuildRequest{Name: "app", Tag: "v1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx, "a", ok.TemplateID, ok.BuildID, BuildSpec{From: "scratch",
		Steps: []Step{{Op: OpRun, Args: []string{"fake-write /hello hi"}}}}); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, b, "a", ok, StatusReady)
	if tpl, err := s.Get(ctx, "a", "app:v1"); err != nil || tpl.TeamID != "a" || tpl.BuildID != ok.BuildID {
		t.Errorf("built template: %+v, %v", tpl, err)
	}
	// Team b: every call on team a's build is a 404.
	for name, fn := range map[string]func() error{
		"status": func() error { _, err := b.Status(ctx, "b", ok.TemplateID, ok.BuildID, 0, 0, ""); return err },
		"logs":   func() error { _, err := b.Logs(ctx, "b", ok.TemplateID, ok.BuildID); return err },
		"start":  func() error { return b.Start(ctx, "b", ok.TemplateID, ok.BuildID, BuildSpec{From: "scratch"}) },
	} {
		if err := fn(); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("team b %s on team a's build: %v", name, err)
		}
	}
	if b.HasTemplate("b", ok.TemplateID) || !b.HasTemplate("a", ok.TemplateID) {
		t.Error("HasTemplate crosses teams")
	}

	// A build under way when the server stops.
	slow, err := b.Request(ctx, "a", BuildRequest{Name: "slow"})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx, "a", slow.TemplateID, slow.BuildID, BuildSpec{From: "scratch",
		Steps: []Step{{Op: OpRun, Args: []string{"fake-block"}}}}); err != nil {
		t.Fatal(err)
	}
	<-runner.started
	// The old "process" ends its build before the test's dirs go.
	defer waitStatus(t, b, "a", slow, StatusReady)
	defer close(runner.release)
	// A new Builds on the same store is the restarted server.
	b2, err := NewBuilds(ctx, s, runner, nil)
	if err != nil {
		t.Fatal(err)
	}
	st, err := b2.Status(ctx, "a", slow.TemplateID, slow.BuildID, 0, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	if st.Status != StatusError || st.Reason == nil || st.Reason.Message != RestartedReason {
		t.Errorf("interrupted build after restart: %+v", st)
	}
	logs, err := b2.Logs(ctx, "a", slow.TemplateID, slow.BuildID)
	if err != nil || len(logs) < 2 || !strings.Contains(logs[len(logs)-1].Message, RestartedReason) {
		t.Errorf("logs after restart: %v %+v", err, logs)
	}
	if st, err := b2.Status(ctx, "a", ok.TemplateID, ok.BuildID, 0, 0, ""); err != nil || st.Status != StatusReady || len(st.LogEntries) == 0 {
		t.Errorf("finished build after restart: %+v, %v", st, err)
	}
	if _, err := b2.Status(ctx, "b", slow.TemplateID, slow.BuildID, 0, 0, ""); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("team b reads team a's build after restart: %v", err)
	}
	// A failed RUN reports its step, exit code and output.
	bad, _ := b2.Request(ctx, "a", BuildRequest{Name: "bad"})
	if err := b2.Start(ctx, "a", bad.TemplateID, bad.BuildID, BuildSpec{From: "scratch",
		Steps: []Step{{Op: OpRun, Args: []string{"fake-fail 7 broken-step-output"}}}}); err != nil {
		t.Fatal(err)
	}
	st = waitStatus(t, b2, "a", bad, StatusError)
	if st.Reason.Step != "1" || !strings.Contains(st.Reason.Message, "exit code 7") || !strings.Contains(st.Reason.Message, "broken-step-output") {
		t.Errorf("failed build reason: %+v", st.Reason)
	}
}

// TestWaitingBuildsAreBounded: a team cannot pile up requested builds it
// never starts (each holds a directory and a record); the bound is its own,
// never another team's, and an unstarted build expires.
func TestWaitingBuildsAreBounded(t *testing.T) {
	ctx := context.Background()
	b, err := NewBuilds(ctx, newTestStore(t), &fakeRunner{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	b.SetWaitingPerTeam(3)
	var first *Job
	for i := range 3 {
		j, err := b.Request(ctx, "a", BuildRequest{Name: fmt.Sprintf("t%d", i)})
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if first == nil {
			first = j
		}
	}
	_, err = b.Request(ctx, "a", BuildRequest{Name: "t3"})
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "--build-requests-per-team") {
		t.Fatalf("a fourth unstarted build: %v, want ErrResourceExhausted naming the flag", err)
	}
	if _, err := b.Request(ctx, "b", BuildRequest{Name: "t0"}); err != nil {
		t.Fatalf("another team is not bound by team a's builds: %v", err)
	}
	// The oldest expires: it fails, frees its place, and cannot be started.
	first.mu.Lock()
	first.CreatedAt = time.Now().Add(-2 * waitingTTL)
	first.mu.Unlock()
	if _, err := b.Request(ctx, "a", BuildRequest{Name: "t3"}); err != nil {
		t.Fatalf("after one expired: %v", err)
	}
	st, err := b.Status(ctx, "a", first.TemplateID, first.BuildID, 0, 0, "")
	if err != nil || st.Status != StatusError || st.Reason == nil || !strings.Contains(st.Reason.Message, "not started") {
		t.Fatalf("expired build: %+v %v", st, err)
	}
	if err := b.Start(ctx, "a", first.TemplateID, first.BuildID, BuildSpec{}); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("starting an expired build: %v, want ErrConflict", err)
	}
}
