package sandbox

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/network"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/template"
	"github.com/agentbox/agentbox/internal/testutil/fake"
)

// fakeEnv is a manager on a fake host (runtime, network, envd) and a real
// store and audit log: the whole state machine, without root.
type fakeEnv struct {
	m     *Manager
	h     *fake.Host
	st    *store.Store
	audit *audit.Log
	team  string
}

func newFakeEnv(t *testing.T, lc LifecycleConfig) *fakeEnv {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.Open(ctx, filepath.Join(dir, "a.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	h := fake.NewHost()
	t.Cleanup(h.Close)
	tpl := oneTemplate{template.Template{ID: "base", Aliases: []string{"base"}, CPUCount: 1, MemoryMB: 512, DiskMB: 1024,
		Layers: []string{"/layers/base"}, StartCmd: "start-kernel", ReadyCmd: "ready-check", DefaultUser: "user", DefaultWorkdir: "/home/user"}}
	if lc.SnapshotDir == "" {
		lc.SnapshotDir = filepath.Join(dir, "snapshots")
	}
	al := audit.New(st)
	m, err := New(ctx, Options{Config: Config{EnvdReadyWait: time.Second}, Lifecycle: lc, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Store: st, Runtime: h.Runtime, Network: h.Network, Templates: tpl, Audit: al})
	if err != nil {
		t.Fatal(err)
	}
	m.envd.client = h.Envd.Client()
	team, err := st.EnsureTeam(ctx, "t1")
	if err != nil {
		t.Fatal(err)
	}
	return &fakeEnv{m: m, h: h, st: st, audit: al, team: team.ID}
}

func (e *fakeEnv) req() CreateRequest {
	return CreateRequest{TeamID: e.team, APIKeyID: "k1", Template: "base", Timeout: time.Minute, Secure: true, AllowInternet: true,
		EnvVars: map[string]string{"A": "1"}}
}

// noLeaks checks that nothing of a failed or removed sandbox is left: no
// container, endpoint, row, live record, reservation or create slot.
func (e *fakeEnv) noLeaks(t *testing.T, keep ...string) {
	t.Helper()
	var want []string
	for _, id := range keep {
		want = append(want, "container "+id, "endpoint "+id)
	}
	slices.Sort(want)
	if got := e.h.Leaks(); !slices.Equal(got, want) {
		t.Errorf("host holds %v, want %v", got, want)
	}
	recs, err := e.st.ListSandboxes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var rows []string
	for _, r := range recs {
		rows = append(rows, r.ID)
	}
	slices.Sort(rows)
	keepSorted := slices.Sorted(slices.Values(keep))
	if !slices.Equal(rows, keepSorted) {
		t.Errorf("store rows %v, want %v", rows, keepSorted)
	}
	e.m.mu.Lock()
	defer e.m.mu.Unlock()
	var live []string
	for id := range e.m.sandboxes {
		live = append(live, id)
	}
	slices.Sort(live)
	if !slices.Equal(live, keepSorted) {
		t.Errorf("live sandboxes %v, want %v", live, keepSorted)
	}
	if len(e.m.admission.reserved) != 0 {
		t.Errorf("maxSandboxes reservations left: %v", e.m.admission.reserved)
	}
	if e.m.admission.createSlots != nil && len(e.m.admission.createSlots) != 0 {
		t.Errorf("%d create slots still held", len(e.m.admission.createSlots))
	}
}

func (e *fakeEnv) events(t *testing.T, action, decision string) []audit.Event {
	t.Helper()
	evs, err := e.audit.Query(context.Background(), audit.Query{Kinds: []string{audit.KindLifecycle}})
	if err != nil {
		t.Fatal(err)
	}
	var out []audit.Event
	for _, ev := range evs {
		if ev.Action == action && ev.Decision == decision {
			out = append(out, ev)
		}
	}
	return out
}

func (e *fakeEnv) create(t *testing.T, req CreateRequest) *Sandbox {
	t.Helper()
	sb, err := e.m.Create(context.Background(), req)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	return sb
}

// TestPipelineRollsBackAtEveryStep fails each path at each step and checks
// that the undo of every earlier step ran and a failure was audited.
func TestPipelineRollsBackAtEveryStep(t *testing.T) {
	type path struct {
		name  string
		steps pipeline
		// setup returns the call that runs the path.
		setup func(t *testing.T, e *fakeEnv) func() error
		keep  func(e *fakeEnv) []string // sandboxes that exist before the call
	}
	var srcID string
	paths := []path{
		{"create", coldStart(), func(t *testing.T, e *fakeEnv) func() error {
			return func() error { _, err := e.m.Create(context.Background(), e.req()); return err }
		}, nil},
		{"restore", restoreSnapshot(), func(t *testing.T, e *fakeEnv) func() error {
			src := e.create(t, e.req())
			srcID = src.ID
			snap, err := e.m.Snapshots().CreateSnapshot(context.Background(), e.team, src.ID, "snap1")
			if err != nil {
				t.Fatal(err)
			}
			r := e.req()
			r.Template = snap.ID
			return func() error { _, err := e.m.Create(context.Background(), r); return err }
		}, func(*fakeEnv) []string { return []string{srcID} }},
		{"build", buildStep(), func(t *testing.T, e *fakeEnv) func() error {
			upper := filepath.Join(t.TempDir(), "upper")
			return func() error {
				return e.m.RunSteps(context.Background(), template.StepRequest{TeamID: e.team, BuildID: "b1", Layers: []string{"/layers/base"},
					Commands: []template.StepCommand{{Line: 2, Cmd: "true"}}, UpperDir: upper})
			}
		}, nil},
	}
	for _, p := range paths {
		for _, s := range p.steps {
			if s.name == StepRegister {
				continue // nothing after it can fail inside the pipeline
			}
			t.Run(p.name+"/"+s.name, func(t *testing.T) {
				e := newFakeEnv(t, LifecycleConfig{})
				call := p.setup(t, e)
				var keep []string
				if p.keep != nil {
					keep = p.keep(e)
				}
				e.h.ResetCalls()
				boom := errors.New("injected failure")
				e.m.inst.stepHook = func(path, step string) error {
					if path == p.name && step == s.name {
						return boom
					}
					return nil
				}
				err := call()
				if !errors.Is(err, boom) {
					t.Fatalf("err = %v, want the injected failure", err)
				}
				e.noLeaks(t, keep...)
				denied := e.events(t, "create", "denied")
				if len(denied) != 1 || denied[0].Fields["step"] != s.name || denied[0].Fields["path"] != p.name {
					t.Fatalf("failure audit events %+v; want one naming step %q", denied, s.name)
				}
				// Whatever was made was undone by the component that made it.
				calls := strings.Join(e.h.Calls(), "\n")
				if strings.Contains(calls, "network.Attach") != strings.Contains(calls, "network.Detach") {
					t.Errorf("attach without detach (or the reverse):\n%s", calls)
				}
			})
		}
	}
}

// TestPipelineComponentFailures fails the real components (network,
// runtime, envd) and checks the error names the step and nothing leaks.
func TestPipelineComponentFailures(t *testing.T) {
	for _, tc := range []struct {
		op, want string
		undone   []string
	}{
		{"network.Attach", "network", nil},
		{"runtime.Create", "start container", []string{"network.Detach"}},
		{"envd.init", "envd did not start", []string{"runtime.Delete", "network.Detach"}},
	} {
		t.Run(tc.op, func(t *testing.T) {
			e := newFakeEnv(t, LifecycleConfig{})
			e.h.FailNext(tc.op, errors.New("component broke"))
			_, err := e.m.Create(context.Background(), e.req())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to name %q", err, tc.want)
			}
			e.noLeaks(t)
			calls := e.h.Calls()
			for _, u := range tc.undone {
				if !slices.ContainsFunc(calls, func(c string) bool { return strings.HasPrefix(c, u+" ") }) {
					t.Errorf("no %s among %v", u, calls)
				}
			}
		})
	}
}

// TestStateMachine walks a sandbox through every transition on the fake
// host: create, pause, resume, snapshot, fork, files-only pause and
// resume, kill.
func TestStateMachine(t *testing.T) {
	ctx := context.Background()
	e := newFakeEnv(t, LifecycleConfig{})
	m, h := e.m, e.h
	sb := e.create(t, e.req())
	if tok, _ := h.Envd.Token(sb.ID); tok != m.Token(sb.ID) {
		t.Fatalf("envd token %q, want the sandbox's", tok)
	}
	if env := h.Envd.Env(sb.ID); env["A"] != "1" {
		t.Fatalf("envd env %v", env)
	}
	if h.Envd.MaxCommand(sb.ID) != int64(DefaultMaxCommandLifetime/time.Second) {
		t.Fatalf("envd command cap %d", h.Envd.MaxCommand(sb.ID))
	}
	if spec, _ := h.Runtime.Spec(sb.ID); !slices.Equal(spec.Layers, []string{"/layers/base"}) || spec.Resources.MemoryMB != 512 {
		t.Fatalf("spec %+v", spec)
	}
	runs := h.Envd.Runs()
	if len(runs) != 1 || runs[0].Cmd != "ready-check" || runs[0].User != "user" || runs[0].Workdir != "/home/user" {
		t.Fatalf("ready command runs %+v", runs)
	}
	if len(e.events(t, "create", "allowed")) != 1 {
		t.Fatal("no create audit event")
	}

	// pause → paused → resume: the same envd memory comes back.
	if err := m.Pause(ctx, e.team, sb.ID); err != nil {
		t.Fatal(err)
	}
	if got, _ := m.Get(ctx, e.team, sb.ID); got.State != StatePaused {
		t.Fatalf("state after pause %s", got.State)
	}
	if _, ok := h.Envd.Token(sb.ID); ok {
		t.Fatal("envd answers while paused")
	}
	if err := m.Pause(ctx, e.team, sb.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("second pause: %v", err)
	}
	if _, resumed, err := m.Resume(ctx, e.team, sb.ID, time.Minute, false); err != nil || !resumed {
		t.Fatalf("resume: %v %v", resumed, err)
	}
	if h.Envd.Inits(sb.ID) != 1 {
		t.Fatalf("a memory resume re-inits envd (%d inits)", h.Envd.Inits(sb.ID))
	}

	// snapshot + fork: copies get their own id, address and token; the
	// restored envd's re-init is authorised by the source's token.
	results, err := m.Snapshots().Fork(ctx, e.team, sb.ID, 2, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range results {
		if r.Err != nil {
			t.Fatalf("fork copy: %v", r.Err)
		}
		c := r.Sandbox
		if c.ID == sb.ID || c.IP == sb.IP {
			t.Fatalf("fork shares id or address: %+v", c)
		}
		if tok, _ := h.Envd.Token(c.ID); tok != m.Token(c.ID) {
			t.Fatalf("fork copy's envd token %q, want its own", tok)
		}
		if c.BaseSnapshot == "" || c.TemplateID != "base" {
			t.Fatalf("fork copy %+v", c)
		}
		if err := m.Kill(ctx, e.team, c.ID); err != nil {
			t.Fatal(err)
		}
	}

	// files-only pause and resume: envd boots fresh and gets the template's
	// start and ready commands again.
	if err := m.PauseFilesystem(ctx, e.team, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, _, err := m.Resume(ctx, e.team, sb.ID, time.Minute, true); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("traffic resumed a files-only pause: %v", err)
	}
	got, resumed, err := m.ResumeFromFiles(ctx, e.team, sb.ID, time.Minute)
	if err != nil || !resumed || got.State != StateRunning {
		t.Fatalf("resume from files: %+v %v %v", got, resumed, err)
	}
	if h.Envd.Inits(sb.ID) != 1 {
		t.Fatalf("fresh boot inits %d", h.Envd.Inits(sb.ID))
	}
	if tok, _ := h.Envd.Token(sb.ID); tok != m.Token(sb.ID) {
		t.Fatal("fresh boot lost the token")
	}

	// files-only resume whose envd fails: the sandbox stays paused (files
	// only), its container stopped again, the row back to paused.
	if err := m.PauseFilesystem(ctx, e.team, sb.ID); err != nil {
		t.Fatal(err)
	}
	h.FailNext("envd.init", errors.New("envd broke"))
	if _, _, err := m.ResumeFromFiles(ctx, e.team, sb.ID, time.Minute); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("failed resume: %v", err)
	}
	if got, _ := m.Get(ctx, e.team, sb.ID); got.State != StatePaused || !got.PausedFS {
		t.Fatalf("after failed resume: %s fs=%v", got.State, got.PausedFS)
	}
	if ok, _ := h.Runtime.HasCheckpoint(ctx, sb.ID); !ok {
		t.Fatal("failed resume left no pause image")
	}
	if _, _, err := m.ResumeFromFiles(ctx, e.team, sb.ID, time.Minute); err != nil {
		t.Fatalf("resume after a failed one: %v", err)
	}

	// kill: everything goes.
	if err := m.Kill(ctx, e.team, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := m.Kill(ctx, e.team, sb.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("second kill: %v", err)
	}
	e.noLeaks(t)
}

// TestSnapshotRestoreHonoursRequest: a create from a snapshot applies the
// request's network policy and command cap, and refuses (naming the field)
// limits and a tier its memory image cannot have.
func TestSnapshotRestoreHonoursRequest(t *testing.T) {
	ctx := context.Background()
	e := newFakeEnv(t, LifecycleConfig{})
	src := e.create(t, e.req())
	snap, err := e.m.Snapshots().CreateSnapshot(ctx, e.team, src.ID, "s1")
	if err != nil {
		t.Fatal(err)
	}
	fsSnap, err := e.m.Snapshots().CreateFilesystemSnapshot(ctx, e.team, src.ID, "fs1")
	if err != nil {
		t.Fatal(err)
	}
	e.h.Runtime.Tiers = []string{"runsc"}

	r := e.req()
	r.Template = "s1"
	r.AllowInternet = false
	r.MaxCommand = 90 * time.Second
	r.Network = &NetworkSpec{AllowOut: []string{"1.1.1.1"}}
	sb, err := e.m.Create(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	pol, _ := e.h.Network.Policy(sb.ID)
	if pol.AllowInternet || pol.TeamID != e.team || len(pol.AllowOut) != 1 {
		t.Fatalf("restored sandbox's policy %+v; want the request's", pol)
	}
	if got := e.h.Envd.MaxCommand(sb.ID); got != 90 {
		t.Fatalf("restored envd's command cap %d, want the request's 90", got)
	}
	if sb.TemplateID != snap.ID || sb.Network == nil {
		t.Fatalf("restored record %+v", sb)
	}

	for _, tc := range []struct {
		name  string
		mod   func(*CreateRequest)
		field string
	}{
		{"memory", func(r *CreateRequest) { r.Limits.MemoryMB = 1024 }, "memoryMB:"},
		{"cpu", func(r *CreateRequest) { r.Limits.CPUCount = 2 }, "cpuCount:"},
		{"tier", func(r *CreateRequest) { r.Isolation = IsolationGVisor }, "isolation:"},
		{"tier by metadata", func(r *CreateRequest) { r.Metadata = map[string]string{MetadataIsolation: IsolationGVisor} }, "isolation:"},
		{"command cap", func(r *CreateRequest) { r.MaxCommand = 48 * time.Hour }, "maxCommandSeconds:"},
		{"network", func(r *CreateRequest) { r.Network = &NetworkSpec{AllowOut: []string{"not an address!"}} }, "network.allowOut"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.req()
			r.Template = "s1"
			tc.mod(&r)
			_, err := e.m.Create(ctx, r)
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("err = %v; want a 400 naming %s", err, tc.field)
			}
		})
	}
	// A filesystem-only snapshot boots fresh: new limits and tiers apply.
	r = e.req()
	r.Template = fsSnap.ID
	r.Limits.MemoryMB = 1024
	r.Isolation = IsolationGVisor
	sb, err = e.m.Create(ctx, r)
	if err != nil {
		t.Fatalf("filesystem-only snapshot with new limits: %v", err)
	}
	if spec, _ := e.h.Runtime.Spec(sb.ID); spec.Resources.MemoryMB != 1024 || spec.Runtime != "runsc" {
		t.Fatalf("spec %+v; want the request's memory and tier", spec)
	}
	if e.h.Envd.Inits(sb.ID) != 1 {
		t.Fatal("fresh boot from a filesystem-only snapshot not initialised")
	}
}

// TestSnapshotsBelongToTheirTeam: another team naming a snapshot (by id or
// name) gets exactly the answer of a missing one.
func TestSnapshotsBelongToTheirTeam(t *testing.T) {
	ctx := context.Background()
	e := newFakeEnv(t, LifecycleConfig{})
	src := e.create(t, e.req())
	snap, err := e.m.Snapshots().CreateSnapshot(ctx, e.team, src.ID, "mine")
	if err != nil {
		t.Fatal(err)
	}
	other, _ := e.st.EnsureTeam(ctx, "t2")
	missing := func(ref string) string {
		r := e.req()
		r.TeamID, r.Template = other.ID, ref
		_, err := e.m.Create(ctx, r)
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("create from %q as another team: %v", ref, err)
		}
		return strings.ReplaceAll(err.Error(), ref, "REF")
	}
	want := missing("nosuchsnapshot")
	for _, ref := range []string{snap.ID, "mine", "mine:default", snap.SnapshotRef()} {
		if got := missing(ref); got != want {
			t.Errorf("another team's snapshot %q: %q; a missing one: %q", ref, got, want)
		}
	}
	if e.m.Snapshots().IsSnapshot(other.ID, "mine") || len(e.m.Snapshots().ListSnapshots(ctx, other.ID, "", "")) != 0 {
		t.Error("another team sees the snapshot")
	}
	if err := e.m.Snapshots().DeleteSnapshot(ctx, other.ID, "mine"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another team deleted the snapshot: %v", err)
	}
}

// TestMaxSandboxesOnEveryPath: a create, a snapshot restore, each fork
// copy and a build step all count toward the team's maxSandboxes.
func TestMaxSandboxesOnEveryPath(t *testing.T) {
	ctx := context.Background()
	e := newFakeEnv(t, LifecycleConfig{})
	if err := e.st.SetTeamQuota(ctx, e.team, store.TeamQuota{MaxSandboxes: 1}); err != nil {
		t.Fatal(err)
	}
	src := e.create(t, e.req())
	snap, err := e.m.Snapshots().CreateSnapshot(ctx, e.team, src.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	r := e.req()
	r.Template = snap.ID
	calls := map[string]func() error{
		"create":  func() error { _, err := e.m.Create(ctx, e.req()); return err },
		"restore": func() error { _, err := e.m.Create(ctx, r); return err },
		"fork": func() error {
			res, err := e.m.Snapshots().Fork(ctx, e.team, src.ID, 1, time.Minute)
			if err != nil {
				return err
			}
			return res[0].Err
		},
		"build": func() error {
			return e.m.RunSteps(ctx, template.StepRequest{TeamID: e.team, BuildID: "b1", Layers: []string{"/l"},
				Commands: []template.StepCommand{{Cmd: "true"}}, UpperDir: filepath.Join(t.TempDir(), "u")})
		},
	}
	for name, call := range calls {
		if err := call(); !errors.Is(err, errdefs.ErrResourceExhausted) {
			t.Errorf("%s past maxSandboxes: %v; want 429", name, err)
		}
	}
	e.noLeaks(t, src.ID)
}

// TestWarmPoolClaim: a create takes a warm sandbox, which gets the
// request's team, policy, env and token; a request the pool cannot honour
// starts cold.
func TestWarmPoolClaim(t *testing.T) {
	ctx := context.Background()
	e := newFakeEnv(t, LifecycleConfig{Pools: map[string]int{"base": 1}})
	e.m.reaper.poolTick(ctx, time.Now())
	deadline := time.Now().Add(5 * time.Second)
	for len(e.m.Pools().List()) == 0 || e.m.Pools().List()[0].Ready < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("pool never filled: %+v", e.m.Pools().List())
		}
		time.Sleep(10 * time.Millisecond)
	}
	var warm string
	e.m.mu.Lock()
	for id := range e.m.sandboxes {
		warm = id
	}
	e.m.mu.Unlock()
	r := e.req()
	r.AllowInternet = false
	sb := e.create(t, r)
	if sb.ID != warm || sb.TeamID != e.team {
		t.Fatalf("claimed %s (team %s), want warm %s", sb.ID, sb.TeamID, warm)
	}
	pol, _ := e.h.Network.Policy(sb.ID)
	if pol.AllowInternet || pol.TeamID != e.team || pol.APIKeyID != "k1" {
		t.Fatalf("claimed sandbox's policy %+v", pol)
	}
	if env := e.h.Envd.Env(sb.ID); env["A"] != "1" {
		t.Fatalf("claimed envd env %v", env)
	}
	if p := e.m.Pools().List()[0]; p.Hits != 1 {
		t.Fatalf("pool stats %+v", p)
	}
	// A team sees its own claim, another team none of it.
	if p := e.m.Pools().Team(e.team)[0]; p.Hits != 1 || p.Ready != 0 || p.Target != 0 {
		t.Fatalf("claiming team's pool view %+v", p)
	}
	if p := e.m.Pools().Team("other-team")[0]; p.Hits != 0 || p.Misses != 0 || p.Template != "base" {
		t.Fatalf("other team's pool view %+v", p)
	}
	// A request for other limits starts cold (and gets them).
	r = e.req()
	r.Limits.MemoryMB = 256
	cold := e.create(t, r)
	if cold.MemoryMB != 256 || cold.ID == warm {
		t.Fatalf("cold start %+v", cold)
	}
}

// TestReapAndHealth: an expired sandbox is removed by the reaper; a dead
// container is reported unhealthy.
func TestReapAndHealth(t *testing.T) {
	ctx := context.Background()
	e := newFakeEnv(t, LifecycleConfig{})
	dead := e.create(t, e.req())
	e.h.Runtime.Stop(dead.ID)
	e.m.health.check(ctx)
	if got, _ := e.m.Get(ctx, e.team, dead.ID); got.Health != HealthError || !strings.Contains(got.HealthReason, "stopped") {
		t.Fatalf("health of a stopped sandbox: %q %q", got.Health, got.HealthReason)
	}
	r := e.req()
	r.Timeout = time.Millisecond
	short := e.create(t, r)
	time.Sleep(5 * time.Millisecond)
	e.m.reaper.reap(ctx)
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := e.m.Get(ctx, e.team, short.ID); errors.Is(err, errdefs.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("expired sandbox not reaped")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(e.events(t, "remove", "info")) != 1 {
		t.Fatal("no remove audit event")
	}
	e.noLeaks(t, dead.ID)
}

// TestReconcileAfterCrash: a restarted manager adopts the intact running
// sandbox and removes rows in creating/killing, runtime and network state
// without a row, and a build step's sandbox.
func TestReconcileAfterCrash(t *testing.T) {
	ctx := context.Background()
	e := newFakeEnv(t, LifecycleConfig{})
	keep := e.create(t, e.req())
	h := e.h
	// A create that crashed after starting its container.
	half := &Sandbox{ID: "ihalf", TeamID: e.team, State: StateCreating}
	if err := e.m.rows.save(ctx, half); err != nil {
		t.Fatal(err)
	}
	_, _ = h.Network.Attach(ctx, half.ID, network.Policy{})
	_ = h.Runtime.Create(ctx, runtimeSpec(half.ID))
	// A kill that crashed before removing anything.
	killing := &Sandbox{ID: "ikilling", TeamID: e.team, State: StateKilling}
	_ = e.m.rows.save(ctx, killing)
	_, _ = h.Network.Attach(ctx, killing.ID, network.Policy{})
	// Runtime and network state with no row at all.
	_ = h.Runtime.Create(ctx, runtimeSpec("iorphan"))
	_, _ = h.Network.Attach(ctx, "iorphan2", network.Policy{})
	// A running sandbox whose container died while the server was down.
	gone := &Sandbox{ID: "igone", TeamID: e.team, State: StateRunning}
	_ = e.m.rows.save(ctx, gone)
	_, _ = h.Network.Attach(ctx, gone.ID, network.Policy{})
	// A build step's sandbox: its build died with the server.
	build := &Sandbox{ID: "ibuild", TeamID: e.team, State: StateRunning, BuildID: "b1"}
	_ = e.m.rows.save(ctx, build)
	_, _ = h.Network.Attach(ctx, build.ID, network.Policy{})
	_ = h.Runtime.Create(ctx, runtimeSpec(build.ID))

	m2, err := New(ctx, Options{Config: Config{EnvdReadyWait: time.Second}, Lifecycle: LifecycleConfig{SnapshotDir: t.TempDir()},
		Log: e.m.log, Store: e.st, Runtime: h.Runtime, Network: h.Network, Templates: e.m.templates})
	if err != nil {
		t.Fatal(err)
	}
	m2.envd.client = h.Envd.Client()
	if err := m2.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	e.m = m2
	e.noLeaks(t, keep.ID)
	if got, err := m2.Get(ctx, e.team, keep.ID); err != nil || got.State != StateRunning {
		t.Fatalf("intact sandbox not adopted: %v", err)
	}
	if pol, _ := h.Network.Policy(keep.ID); pol.TeamID != e.team {
		t.Fatalf("adopted sandbox's policy not restored: %+v", pol)
	}
}

func runtimeSpec(id string) runtime.Spec { return runtime.Spec{ID: id} }

// TestRunSteps runs build steps in a hidden sandbox of the team and
// captures its writable layer; a failing step names its line and leaves
// nothing.
func TestRunSteps(t *testing.T) {
	ctx := context.Background()
	e := newFakeEnv(t, LifecycleConfig{})
	other := e.create(t, e.req())
	upper := filepath.Join(t.TempDir(), "upper")
	var out bytes.Buffer
	var seen []string
	probe := writerFunc(func(p []byte) (int, error) {
		out.Write(p)
		// While it runs, the step sandbox is the team's (it counts) but
		// no API call sees it.
		e.m.mu.Lock()
		for id, sb := range e.m.sandboxes {
			if sb.BuildID != "" {
				seen = append(seen, id)
				pol, _ := e.h.Network.Policy(id)
				if sb.TeamID != e.team || !pol.AllowInternet || pol.TeamID != e.team {
					t.Errorf("step sandbox %+v policy %+v", sb, pol)
				}
			}
		}
		e.m.mu.Unlock()
		for _, id := range seen {
			if _, err := e.m.Get(ctx, e.team, id); !errors.Is(err, errdefs.ErrNotFound) {
				t.Errorf("the API sees the step sandbox: %v", err)
			}
			if _, ok := e.m.Lookup(id); ok {
				t.Error("the gateway sees the step sandbox")
			}
		}
		if slices.ContainsFunc(e.m.List(ctx, e.team), func(s *Sandbox) bool { return s.BuildID != "" }) {
			t.Error("the step sandbox is listed")
		}
		return len(p), nil
	})
	err := e.m.RunSteps(ctx, template.StepRequest{
		TeamID: e.team, BuildID: "b1", Layers: []string{"/layers/base"}, UpperDir: upper, Output: probe, MemoryMB: 256,
		Commands: []template.StepCommand{
			{Line: 3, Cmd: "apt-get install -y curl"},
			{Line: 4, Cmd: "make", User: "builder", Workdir: "/src", Env: map[string]string{"CC": "gcc"}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) == 0 || !strings.Contains(out.String(), "ok") {
		t.Fatalf("output %q, step sandboxes seen %v", out.String(), seen)
	}
	if fi, err := os.Stat(upper); err != nil || !fi.IsDir() {
		t.Fatalf("writable layer not captured: %v", err)
	}
	runs := e.h.Envd.Runs()
	last := runs[len(runs)-1]
	if last.Cmd != "make" || last.User != "builder" || last.Workdir != "/src" || last.Env["CC"] != "gcc" {
		t.Fatalf("last run %+v", last)
	}
	if spec, ok := e.h.Runtime.Spec(seen[0]); ok {
		t.Fatalf("step sandbox still exists: %+v", spec)
	}
	e.noLeaks(t, other.ID)

	// A failing step: its line in the error, nothing captured, nothing left.
	upper2 := filepath.Join(t.TempDir(), "upper")
	err = e.m.RunSteps(ctx, template.StepRequest{TeamID: e.team, BuildID: "b2", Layers: []string{"/layers/base"}, UpperDir: upper2,
		Commands: []template.StepCommand{{Line: 7, Cmd: "true"}, {Line: 8, Cmd: "exit 3"}, {Line: 9, Cmd: "never"}}})
	if err == nil || !strings.Contains(err.Error(), "line 8") || !strings.Contains(err.Error(), "code 3") {
		t.Fatalf("failing step: %v", err)
	}
	if _, err := os.Stat(upper2); err == nil {
		t.Fatal("a failed build captured its layer")
	}
	if slices.ContainsFunc(e.h.Envd.Runs(), func(r fake.Run) bool { return r.Cmd == "never" }) {
		t.Fatal("steps ran after a failure")
	}
	e.noLeaks(t, other.ID)

	// Over the team's quota: refused naming the field.
	err = e.m.RunSteps(ctx, template.StepRequest{TeamID: e.team, BuildID: "b3", Layers: []string{"/l"}, UpperDir: filepath.Join(t.TempDir(), "u"),
		MemoryMB: 1 << 20, Commands: []template.StepCommand{{Cmd: "true"}}})
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "memoryMB") {
		t.Fatalf("build over quota: %v", err)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestWakeEndsWithTheSandbox: data-plane traffic runs under Wake's live
// context, which a kill cancels (a stream to a killed sandbox must not wait
// on a peer that cannot answer) and a pause keeps.
func TestWakeEndsWithTheSandbox(t *testing.T) {
	e := newFakeEnv(t, LifecycleConfig{})
	ctx := context.Background()
	sb := e.create(t, e.req())
	_, live, done, ok := e.m.WakeIf(ctx, sb.ID, nil)
	if !ok {
		t.Fatal("Wake of a running sandbox failed")
	}
	defer done()
	_, other, otherDone, ok := e.m.WakeIf(ctx, sb.ID, nil)
	if !ok {
		t.Fatal("second Wake failed")
	}
	otherDone() // one request ending does not end the others
	if err := live.Err(); err != nil {
		t.Fatalf("live context ended with another request: %v", err)
	}
	if other.Err() == nil {
		t.Error("done did not release its own context")
	}
	if err := e.m.Kill(ctx, e.team, sb.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case <-live.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("traffic to a killed sandbox was not ended")
	}
	if _, _, _, ok := e.m.WakeIf(ctx, sb.ID, nil); ok {
		t.Error("Wake found a killed sandbox")
	}
	e.m.mu.Lock()
	defer e.m.mu.Unlock()
	if len(e.m.idle.gone) != 0 || e.m.idle.activity[sb.ID] != nil {
		t.Errorf("state of a removed sandbox kept: gone %v, activity %v", e.m.idle.gone, e.m.idle.activity[sb.ID])
	}
}
