// Package crash crashes the server (SIGKILL of itself, --test-crash-after)
// right after every named step of every operation that changes state, starts
// it again on the same data dir, and checks that what the client was told
// exists is there and works, that nothing half-made is left, and that the
// host holds nothing more than before the operation.
package crash

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
	"github.com/agentbox/agentbox/e2e/wire"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/volume"
)

// fixture is what a row's setup made before the crash.
type fixture struct {
	src      string // a running (or paused) sandbox with /tmp/mark
	pid      string // a background process in src: alive again means memory kept
	snapshot string // a snapshot of src
	fsPaused bool   // src was paused without memory: its processes are gone
	paused   bool   // src is paused: no container or cgroup on the host
	volume   string // a volume's name
	// volumeID and volumeToken reach the volume's content API.
	volumeID, volumeToken string
	build                 *tplBuild // a template build whose RUN step needs a build sandbox
}

// operation drives one operation to its crash points.
type operation struct {
	flags   []string // serve flags the row's server needs (a warm pool)
	setup   func(t *testing.T, r *rig) fixture
	trigger func(r *rig, f fixture) // runs until the server dies
}

type rig struct {
	*harness.Server
	c   *wire.Client
	ctx context.Context
}

func (r *rig) do(method, path string, body any) (int, []byte) {
	st, b, err := r.Do(r.ctx, r.APIKey, method, path, body)
	if err != nil {
		return 0, []byte(err.Error())
	}
	return st, b
}

// running makes a sandbox with a marker file and a background process.
func (r *rig) running(t *testing.T) fixture {
	t.Helper()
	sb, err := r.c.Create(r.ctx, wire.CreateRequest{TemplateID: "base", Timeout: 900})
	if err != nil {
		t.Fatalf("setup create: %v", err)
	}
	res, err := r.c.Run(r.ctx, sb, "user", "echo "+sb.SandboxID+" > /tmp/mark; sleep 3600 >/dev/null 2>&1 & echo $!")
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("setup run: %v %+v", err, res)
	}
	return fixture{src: sb.SandboxID, pid: strings.TrimSpace(res.Stdout)}
}

func operations() map[string]operation {
	return map[string]operation{
		"create": {
			setup: func(*testing.T, *rig) fixture { return fixture{} },
			trigger: func(r *rig, _ fixture) {
				_, _ = r.c.Create(r.ctx, wire.CreateRequest{TemplateID: "base", Timeout: 900})
			},
		},
		"restore": {
			setup: func(t *testing.T, r *rig) fixture {
				f := r.running(t)
				st, b := r.do("POST", "/sandboxes/"+f.src+"/snapshots", map[string]any{})
				var sn struct {
					SnapshotID string `json:"snapshotID"`
				}
				if st != http.StatusCreated || json.Unmarshal(b, &sn) != nil {
					t.Fatalf("setup snapshot: %d %s", st, b)
				}
				f.snapshot = sn.SnapshotID
				return f
			},
			trigger: func(r *rig, f fixture) {
				_, _ = r.c.Create(r.ctx, wire.CreateRequest{TemplateID: f.snapshot, Timeout: 900})
			},
		},
		"fork": {
			setup:   func(t *testing.T, r *rig) fixture { return r.running(t) },
			trigger: func(r *rig, f fixture) { r.do("POST", "/sandboxes/"+f.src+"/fork", map[string]any{}) },
		},
		"snapshot": {
			setup:   func(t *testing.T, r *rig) fixture { return r.running(t) },
			trigger: func(r *rig, f fixture) { r.do("POST", "/sandboxes/"+f.src+"/snapshots", map[string]any{}) },
		},
		"kill": {
			setup:   func(t *testing.T, r *rig) fixture { return r.running(t) },
			trigger: func(r *rig, f fixture) { _ = r.c.Kill(r.ctx, f.src) },
		},
		"pause": {
			setup:   func(t *testing.T, r *rig) fixture { return r.running(t) },
			trigger: func(r *rig, f fixture) { r.do("POST", "/sandboxes/"+f.src+"/pause", nil) },
		},
		// "resume" rows: a files-only resume runs the start pipeline (its
		// named steps), a memory resume its own two steps.
		"resume": {
			setup: func(t *testing.T, r *rig) fixture {
				f := r.running(t)
				if st, b := r.do("POST", "/sandboxes/"+f.src+"/pause", map[string]any{"memory": false}); st != http.StatusNoContent {
					t.Fatalf("setup pause: %d %s", st, b)
				}
				f.fsPaused, f.paused = true, true
				return f
			},
			trigger: func(r *rig, f fixture) { r.do("POST", "/sandboxes/"+f.src+"/resume", map[string]any{"timeout": 900}) },
		},
		volume.OpCreate: {
			setup: func(*testing.T, *rig) fixture { return fixture{} },
			trigger: func(r *rig, _ fixture) {
				r.do("POST", "/volumes", map[string]any{"name": "crash", "sizeMB": 64})
			},
		},
		volume.OpWrite: volumeWrite(),
		volume.OpDelete: {
			setup: func(t *testing.T, r *rig) fixture {
				st, b := r.do("POST", "/volumes", map[string]any{"name": "crash", "sizeMB": 64})
				if st != http.StatusCreated {
					t.Fatalf("setup volume: %d %s", st, b)
				}
				return fixture{volume: "crash"}
			},
			trigger: func(r *rig, _ fixture) {
				for _, v := range volumes(r) {
					r.do("DELETE", "/volumes/"+v.ID, nil)
				}
			},
		},
		// A template build with a RUN step starts a hidden build sandbox
		// (the "build" start path); the crash lands in its pipeline.
		"build": {
			setup: func(t *testing.T, r *rig) fixture {
				return fixture{build: requestBuild(r.ctx, t, r.Server, fmt.Sprintf("crash-build-%d", time.Now().UnixNano()%1e6))}
			},
			trigger: func(r *rig, f fixture) {
				r.do("POST", "/v2/templates/"+f.build.templateID+"/builds/"+f.build.buildID,
					map[string]any{"fromTemplate": "base", "steps": []map[string]any{{"type": "RUN", "args": []string{"echo crash-row", "root"}}}})
			},
		},
		// A create of a pooled template claims the pool's sandbox. Creates
		// repeat until the server dies: one made before the pool's sandbox
		// is ready starts cold and is checked like any other.
		"claim": {
			flags: []string{"--pool", "base=1"},
			setup: func(t *testing.T, r *rig) fixture {
				for len(r.HostState(r.ctx)[harness.KindContainer]) == 0 {
					select {
					case <-r.ctx.Done():
						t.Fatal("the warm pool never started a sandbox")
					case <-time.After(100 * time.Millisecond):
					}
				}
				return fixture{}
			},
			trigger: func(r *rig, _ fixture) {
				for r.ctx.Err() == nil {
					if _, err := r.c.Create(r.ctx, wire.CreateRequest{TemplateID: "base", Timeout: 900}); err != nil {
						return
					}
				}
			},
		},
		"resume-memory": {
			setup: func(t *testing.T, r *rig) fixture {
				f := r.running(t)
				if st, b := r.do("POST", "/sandboxes/"+f.src+"/pause", nil); st != http.StatusNoContent {
					t.Fatalf("setup pause: %d %s", st, b)
				}
				f.paused = true
				return f
			},
			trigger: func(r *rig, f fixture) { r.do("POST", "/sandboxes/"+f.src+"/resume", map[string]any{"timeout": 900}) },
		},
	}
}

// rowOp maps a crash point to the operation that reaches it.
func rowOp(c sandbox.CrashStep) (string, bool) {
	switch {
	case c.Op == "resume" && (c.Step == "persisted" || c.Step == "restored"):
		return "resume-memory", true
	}
	_, ok := operations()[c.Op]
	return c.Op, ok
}

func TestCrashAtEveryStep(t *testing.T) {
	s := harness.Start(t)
	ops := operations()
	only := strings.TrimSpace(testFilterStep())
	points := sandbox.CrashSteps()
	for _, p := range append(volume.CrashSteps(), volume.WriteSteps()...) {
		points = append(points, sandbox.CrashStep{Op: p[0], Step: p[1]})
	}
	for _, point := range points {
		name, ok := rowOp(point)
		if !ok || (only != "" && !strings.Contains(point.String(), only)) {
			continue
		}
		op := ops[name]
		t.Run(point.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
			defer cancel()
			s.Terminate(t)
			s.Launch(t, append([]string{"--test-crash-after", point.String()}, op.flags...)...)
			r := &rig{Server: s, c: wire.New(s.URL, s.APIKey), ctx: ctx}
			before := s.HostState(ctx)
			f := op.setup(t, r)
			if f.src != "" {
				// The leak check must see a live sandbox, else it proves nothing.
				seen := before.Leaked(s.HostState(ctx))
				for _, kind := range []string{harness.KindContainer, harness.KindCgroup, harness.KindRow, harness.KindNetns} {
					if f.paused && (kind == harness.KindContainer || kind == harness.KindCgroup) {
						continue
					}
					if !slices.ContainsFunc(seen, func(item string) bool { return strings.HasPrefix(item, kind+": ") }) {
						t.Fatalf("the host-state snapshot does not see sandbox %s's %s (new: %v)", f.src, kind, seen)
					}
				}
			}
			tctx, tcancel := context.WithCancel(ctx)
			rt := &rig{Server: s, c: wire.New(s.URL, s.APIKey), ctx: tctx}
			done := make(chan struct{})
			go func() { defer close(done); op.trigger(rt, f) }()
			select {
			case <-s.Exited():
			case <-time.After(4 * time.Minute):
				tcancel()
				<-done
				t.Fatalf("the server did not crash at %s", point)
			}
			tcancel()
			<-done
			if ps := s.ProcessState(); ps == nil || !killed(ps.Sys()) {
				t.Fatalf("the server exited with %v, want SIGKILL at %s", ps, point)
			}
			s.Launch(t)
			r.c = wire.New(s.URL, s.APIKey)
			checkVolumeWrite(t, r, point, f) // before check writes into every volume
			check(t, r, name, f)
			checkFork(t, r, point, f, before)
			cleanUp(t, r)
			s.WaitNoLeaks(t, before)
		})
	}
}

// testFilterStep narrows the table to crash points containing
// $CRASH_POINT (for a quick local run of one row).
func testFilterStep() string { return os.Getenv("CRASH_POINT") }

func killed(sys any) bool {
	ws, ok := sys.(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// check verifies what the restarted server holds: the setup's sandbox is
// there (unless the crash was in its kill) and works with its files (and
// its memory, unless it was paused without); any other sandbox (a create,
// restore or fork that got far enough) works; the setup's snapshot is kept.
func check(t *testing.T, r *rig, op string, f fixture) {
	t.Helper()
	list, err := r.c.List(r.ctx, nil)
	if err != nil {
		t.Fatalf("list after restart: %v", err)
	}
	seen := false
	for _, sb := range list {
		if sb.State != "running" && sb.State != "paused" {
			t.Errorf("sandbox %s is %q after the restart, want running or paused", sb.SandboxID, sb.State)
			continue
		}
		if sb.SandboxID == f.src {
			seen = true
		}
		// Connect resumes a paused sandbox and hands out its envd token.
		st, b := r.do("POST", "/sandboxes/"+sb.SandboxID+"/connect", map[string]any{"timeout": 900})
		var conn wire.Sandbox
		if (st != http.StatusOK && st != http.StatusCreated) || json.Unmarshal(b, &conn) != nil {
			t.Errorf("connect %s (%s) after the restart: %d %s", sb.SandboxID, sb.State, st, b)
			continue
		}
		cmd := "cat /tmp/mark 2>/dev/null; echo ok"
		if sb.SandboxID == f.src && !f.fsPaused {
			cmd = "cat /tmp/mark; kill -0 " + f.pid + " && echo ok"
		}
		res, err := r.c.Run(r.ctx, &conn, "user", cmd)
		switch {
		case err != nil:
			t.Errorf("sandbox %s after the restart: %v", sb.SandboxID, err)
		case sb.SandboxID == f.src && res.Stdout != f.src+"\nok\n":
			t.Errorf("sandbox %s after the restart: %q, want its mark and (memory kept) its process", sb.SandboxID, res.Stdout)
		case f.src != "" && op != "create" && sb.SandboxID != f.src && res.Stdout != f.src+"\nok\n":
			t.Errorf("copy %s of %s after the restart: %q, want the source's mark", sb.SandboxID, f.src, res.Stdout)
		case !strings.HasSuffix(res.Stdout, "ok\n"):
			t.Errorf("sandbox %s after the restart: %+v", sb.SandboxID, res)
		}
	}
	if f.src != "" && !seen && op != "kill" {
		t.Errorf("sandbox %s was lost in the crash", f.src)
	}
	if f.build != nil {
		// The build is failed with the restart reason (its client sees it
		// in the build status), and its build sandbox is gone: the leak
		// check after the row sees no container, cgroup or netns of it.
		f.build.ctx = r.ctx
		checkBuild(r.ctx, t, r.Server, f.build)
	}
	if f.snapshot != "" && !slices.Contains(snapshots(t, r), f.snapshot) {
		t.Errorf("snapshot %s was lost in the crash", f.snapshot)
	}
	// A volume the crash left whole must mount and take a write.
	for _, v := range volumes(r) {
		sb, err := r.c.Create(r.ctx, wire.CreateRequest{TemplateID: "base", Timeout: 900, VolumeMounts: []wire.VolumeMount{{Name: v.Name, Path: "/mnt/v"}}})
		if err != nil {
			t.Errorf("mount volume %s kept after the crash: %v", v.Name, err)
			continue
		}
		res, err := r.c.Run(r.ctx, sb, "user", "echo hi > /mnt/v/x && cat /mnt/v/x")
		if err != nil || res.Stdout != "hi\n" {
			t.Errorf("write to volume %s after the crash: %v %+v", v.Name, err, res)
		}
	}
	// A snapshot the crash left whole must restore.
	if op == "snapshot" {
		for _, sn := range snapshots(t, r) {
			sb, err := r.c.Create(r.ctx, wire.CreateRequest{TemplateID: sn, Timeout: 900})
			if err != nil {
				t.Errorf("restore snapshot %s kept after the crash: %v", sn, err)
				continue
			}
			res, err := r.c.Run(r.ctx, sb, "user", "cat /tmp/mark")
			if err != nil || res.Stdout != f.src+"\n" {
				t.Errorf("sandbox restored from %s: %v %+v, want the mark", sn, err, res)
			}
		}
	}
}

func snapshots(t *testing.T, r *rig) []string {
	t.Helper()
	st, b := r.do("GET", "/snapshots", nil)
	var out []struct {
		SnapshotID string `json:"snapshotID"`
	}
	if st != http.StatusOK || json.Unmarshal(b, &out) != nil {
		t.Fatalf("list snapshots: %d %s", st, b)
	}
	var ids []string
	for _, sn := range out {
		ids = append(ids, sn.SnapshotID)
	}
	return ids
}

type vol struct {
	ID   string `json:"volumeID"`
	Name string `json:"name"`
}

func volumes(r *rig) []vol {
	st, b := r.do("GET", "/volumes", nil)
	var out []vol
	if st != http.StatusOK || json.Unmarshal(b, &out) != nil {
		return []vol{{ID: "(list volumes: " + string(b) + ")"}}
	}
	return out
}

// cleanUp kills every sandbox and deletes every snapshot, so the leak check
// compares with the host before the row.
func cleanUp(t *testing.T, r *rig) {
	t.Helper()
	list, err := r.c.List(r.ctx, nil)
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	var errs []error
	for _, sb := range list {
		if err := r.c.Kill(r.ctx, sb.SandboxID); err != nil && !wire.IsStatus(err, 404) {
			errs = append(errs, fmt.Errorf("kill %s: %w", sb.SandboxID, err))
		}
	}
	for _, sn := range snapshots(t, r) {
		if st, b := r.do("DELETE", "/templates/"+url.PathEscape(sn), nil); st != http.StatusNoContent {
			errs = append(errs, fmt.Errorf("delete snapshot %s: %d %s", sn, st, b))
		}
	}
	for _, v := range volumes(r) {
		if st, b := r.do("DELETE", "/volumes/"+v.ID, nil); st != http.StatusNoContent {
			errs = append(errs, fmt.Errorf("delete volume %s: %d %s", v.Name, st, b))
		}
	}
	if err := errors.Join(errs...); err != nil {
		t.Errorf("clean up after the row: %v", err)
	}
}
