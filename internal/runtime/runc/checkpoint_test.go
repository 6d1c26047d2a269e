package runc

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/network"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/bundle"
)

func TestCRIUVersion(t *testing.T) {
	for _, tc := range []struct {
		out  string
		want bool
	}{
		{"Version: 4.2.1\n", true},
		{"Version: 4.2\nGitID: x\n", true},
		{"Version: 5.0\n", true},
		{"Version: 4.1.1\n", false},
		{"Version: 3.17.1\n", false},
		{"garbage", false},
	} {
		if got := criuVersionOK(tc.out); got != tc.want {
			t.Errorf("criuVersionOK(%q) = %v, want %v", tc.out, got, tc.want)
		}
	}
}

// counterInit is the test init plus a child shell that keeps a count in
// memory and writes it to /tmp/count, and a background sleep: a restored
// sandbox continues the count with the same pids. The children must descend
// from init (as envd's do) for CRIU to dump them.
const counterInit = `package main

import (
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
)

func main() {
	script := "rm -f /tmp/count; sleep 3600 & echo $! > /tmp/sleep.pid; i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.05; done"
	if err := exec.Command("/bin/sh", "-c", script).Start(); err != nil {
		panic(err)
	}
	http.HandleFunc("/read", func(w http.ResponseWriter, r *http.Request) {
		b, err := os.ReadFile(r.URL.Query().Get("p"))
		if err != nil {
			http.Error(w, err.Error(), 404)
			return
		}
		w.Write(b)
	})
	http.HandleFunc("/hostname", func(w http.ResponseWriter, r *http.Request) {
		h, _ := os.Hostname()
		w.Write([]byte(h))
	})
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	l, err := lc.Listen(context.Background(), "tcp", ":49983")
	if err != nil {
		panic(err)
	}
	http.Serve(l, nil)
}
`

// useCounterInit replaces the test init binary with counterInit.
func (e *env) useCounterInit(t *testing.T) {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(dir, "init.go")
	if err := os.WriteFile(src, []byte(counterInit), 0o644); err != nil {
		t.Fatal(err)
	}
	build := exec.Command("go", "build", "-o", e.envd, src)
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
	build.Dir = dir
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build counter init: %v\n%s", err, out)
	}
}

func count(t *testing.T, ep network.Endpoint) int {
	t.Helper()
	for range 100 {
		s := strings.TrimSpace(get(t, ep, "read?p=/tmp/count"))
		if n, err := strconv.Atoi(s); err == nil {
			return n
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no count: %q", get(t, ep, "read?p=/tmp/count"))
	return 0
}

func requireCRIU(t *testing.T, e *env) {
	t.Helper()
	if err := e.rc.CheckpointSupported(); err != nil {
		t.Skip(err)
	}
}

func TestCheckpointRestoreInPlace(t *testing.T) {
	for _, userns := range []bool{false, true} {
		t.Run(fmt.Sprintf("userns=%v", userns), func(t *testing.T) { testCheckpointRestoreInPlace(t, userns) })
	}
}

func testCheckpointRestoreInPlace(t *testing.T, userns bool) {
	e := setup(t, userns)
	requireCRIU(t, e)
	ctx := context.Background()
	e.useCounterInit(t)
	ep := e.sandbox(t, "ckpt1", runtime.Resources{MemoryMB: 256})

	count(t, ep) // the counter runs, so the sleep's pid file is written
	sleepPid := strings.TrimSpace(get(t, ep, "read?p=/tmp/sleep.pid"))
	if got := get(t, ep, "read?p=/proc/"+sleepPid+"/cmdline"); !strings.HasPrefix(got, "sleep") {
		t.Fatalf("before: pid %s is %q", sleepPid, got)
	}

	for cycle := range 2 {
		before := count(t, ep)
		v1 := e.rc.freezerStateFile("ckpt1") != ""
		if err := e.rt.Checkpoint(ctx, "ckpt1", runtime.CheckpointOptions{}); err != nil {
			t.Fatalf("cycle %d: checkpoint: %v", cycle, err)
		}
		if v1 {
			assertFoundFrozen(t, filepath.Join(e.b.Dir("ckpt1"), bundle.CRIUWorkDir, "dump.log"))
		}
		if ok, err := e.rt.HasCheckpoint(ctx, "ckpt1"); err != nil || !ok {
			t.Fatalf("cycle %d: HasCheckpoint = %v, %v", cycle, ok, err)
		}
		if st, err := e.rt.State(ctx, "ckpt1"); err != nil || st != runtime.StatusStopped {
			t.Fatalf("cycle %d: state after checkpoint = %v, %v; want stopped", cycle, st, err)
		}
		if err := e.rt.Restore(ctx, runtime.Spec{ID: "ckpt1"}, runtime.RestoreOptions{}); err != nil {
			t.Fatalf("cycle %d: restore: %v", cycle, err)
		}
		assertKdatLoaded(t, filepath.Join(e.b.Dir("ckpt1"), criuRestoreLog))
		if err := e.rt.DropCheckpoint(ctx, "ckpt1"); err != nil {
			t.Fatal(err)
		}
		if st, _ := e.rt.State(ctx, "ckpt1"); st != runtime.StatusRunning {
			t.Fatalf("cycle %d: state after restore = %v", cycle, st)
		}
		after := count(t, ep)
		for deadline := time.Now().Add(10 * time.Second); after <= before && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
			after = count(t, ep)
		}
		if after <= before || after > before+400 {
			t.Fatalf("cycle %d: count %d after restore, %d before: the loop did not continue", cycle, after, before)
		}
		if got := get(t, ep, "read?p=/proc/"+sleepPid+"/cmdline"); !strings.HasPrefix(got, "sleep") {
			t.Fatalf("cycle %d: pid %s is %q, want the same sleep", cycle, sleepPid, got)
		}
	}
}

func TestForkFromLiveCheckpoint(t *testing.T) {
	for _, userns := range []bool{false, true} {
		t.Run(fmt.Sprintf("userns=%v", userns), func(t *testing.T) { testForkFromLiveCheckpoint(t, userns) })
	}
}

func testForkFromLiveCheckpoint(t *testing.T, userns bool) {
	e := setup(t, userns)
	requireCRIU(t, e)
	ctx := context.Background()
	e.useCounterInit(t)
	ep := e.sandbox(t, "fsrc", runtime.Resources{MemoryMB: 256})

	time.Sleep(200 * time.Millisecond)

	snap := t.TempDir()
	img, upper := filepath.Join(snap, "image"), filepath.Join(snap, "upper")
	if err := e.rt.Checkpoint(ctx, "fsrc", runtime.CheckpointOptions{ImageDir: img, LeaveRunning: true, UpperCopy: upper}); err != nil {
		t.Fatal(err)
	}
	if st, _ := e.rt.State(ctx, "fsrc"); st != runtime.StatusRunning {
		t.Fatalf("source state after live checkpoint = %v", st)
	}
	atSnap := count(t, ep)
	for _, id := range []string{"fork1", "fork2"} {
		fep, err := e.net.Attach(ctx, id, network.Policy{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = e.rt.Delete(ctx, id)
			_ = e.net.Detach(ctx, id)
		})
		spec := runtime.Spec{ID: id, Layers: append(append([]string{}, e.layers...), upper), NetNSPath: fep.NetNSPath, DNS: e.net.DNS(), Resources: runtime.Resources{MemoryMB: 256}}
		if err := e.rt.Restore(ctx, spec, runtime.RestoreOptions{ImageDir: img, NewNetwork: true}); err != nil {
			t.Fatalf("%s: restore: %v", id, err)
		}
		time.Sleep(100 * time.Millisecond)
		if n := count(t, fep); n < 1 || n > atSnap+100 {
			t.Fatalf("%s: count %d, source was at %d when snapshotted", id, n, atSnap)
		}
		if got := get(t, fep, "hostname"); got == "" {
			t.Fatalf("%s: no answer", id)
		}
	}
	if n := count(t, ep); n < atSnap {
		t.Fatalf("source count went back: %d < %d", n, atSnap)
	}
}

// BenchmarkFreezeThaw measures the freezer pause of a sandbox, the fast
// mode for short idles (memory stays resident).
func BenchmarkFreezeThaw(b *testing.B) {
	e := setup(b)
	ctx := context.Background()
	e.sandbox(b, "frz", runtime.Resources{MemoryMB: 256})
	for b.Loop() {
		if err := e.rt.Freeze(ctx, "frz"); err != nil {
			b.Fatal(err)
		}
		if err := e.rt.Thaw(ctx, "frz"); err != nil {
			b.Fatal(err)
		}
	}
}

// assertKdatLoaded checks that the CRIU run that wrote log read its
// kernel-feature cache instead of probing the kernel (kdat.go), also where
// /run is not a tmpfs.
func assertKdatLoaded(t *testing.T, log string) {
	t.Helper()
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte("Loaded kdat cache from "+criuKdatFile)) {
		t.Fatalf("CRIU probed the kernel instead of reading its cache %s; its log %s:\n%s", criuKdatFile, log, b)
	}
}

// assertFoundFrozen checks that the CRIU dump that wrote log found the
// sandbox's cgroup frozen already (freezefast.go), so it did not wait for
// the freezer in its steps of 100 ms.
func assertFoundFrozen(t *testing.T, log string) {
	t.Helper()
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	first := ""
	for l := range strings.Lines(string(b)) {
		if _, st, ok := strings.Cut(l, "freezer.state="); ok {
			first = strings.TrimSpace(st)
			break
		}
	}
	if first != "FROZEN" || bytes.Contains(b, []byte("attempts done")) {
		t.Fatalf("CRIU froze the sandbox itself (first freezer state %q); its log %s:\n%s", first, log, b)
	}
}
