package runc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/network"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/bundle"
	"github.com/agentbox/agentbox/internal/runtime/runsc"
	"github.com/agentbox/agentbox/internal/template"
	"github.com/agentbox/agentbox/internal/testutil"
)

// baseLayers returns the layers of the base template in the host's shared
// template cache (the one the end-to-end harness uses, or
// $AGENTBOX_TEMPLATE_DIR), building it there first if it is missing (1-2
// minutes, once per host): the tests run real containers on a real Debian
// rootfs and must not skip for want of one.
func baseLayers(tb testing.TB) []string {
	tb.Helper()
	dir := os.Getenv("AGENTBOX_TEMPLATE_DIR")
	if dir == "" {
		dir = "/var/cache/agentbox/templates"
	}
	ctx := context.Background()
	st, err := template.NewStore(dir, slog.Default())
	if err != nil {
		tb.Fatalf("template store %s: %v", dir, err)
	}
	tpl, err := st.Get(ctx, "", "base")
	if err != nil {
		tb.Logf("building the base template in %s (first use on this host)", dir)
		if tpl, err = st.Build(ctx, template.BuiltinDefinitions()["base"], nil, io.Discard); err != nil {
			tb.Fatalf("build base template: %v", err)
		}
	}
	if len(tpl.Layers) == 0 {
		tb.Fatalf("base template %s has no layers", tpl.ID)
	}
	return tpl.Layers
}

const cgroupRoot = "/sys/fs/cgroup"

// cgroupV2 reports whether the host has the unified cgroup hierarchy only.
func cgroupV2() bool {
	var st unix.Statfs_t
	return unix.Statfs(cgroupRoot, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
}

// testInit stands in for envd: it records that it ran, writes a log line
// through the log mount, and serves a few files over HTTP on envd's port.
const testInit = `package main

import (
	"context"
	"net"
	"net/http"
	"os"
)

func main() {
	if len(os.Args) == 3 && os.Args[1] == "--log-file" {
		os.WriteFile(os.Args[2], []byte("test init started\n"), 0o644)
	}
	os.WriteFile("/written-by-init", []byte("hello"), 0o644)
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

type env struct {
	rt        *runtime.Tiers // the runtime the manager sees: runc and runsc
	rc        *Driver
	b         *bundle.Store
	bcfg      bundle.Config
	runcRoot  string
	runscRoot string
	envd      string
	net       *network.Manager
	layers    []string
	netCfg    network.Config
}

// newRuntime makes a bundle store and both tiers' drivers over e's
// directories, as a server does; net is the network plugger.
func (e *env) newRuntime(tb testing.TB, bcfg bundle.Config, net runtime.NetPlugger) (*runtime.Tiers, *Driver, *bundle.Store) {
	tb.Helper()
	b, err := bundle.New(bcfg, slog.Default())
	if err != nil {
		tb.Fatal(err)
	}
	rc, err := New(Config{Bundles: b, Root: e.runcRoot, Net: net}, slog.Default())
	if err != nil {
		tb.Fatal(err)
	}
	rs, err := runsc.New(runsc.Config{Bundles: b, Root: e.runscRoot, Net: net}, slog.Default())
	if err != nil {
		tb.Fatal(err)
	}
	ts, err := runtime.NewTiers(rc.Tier(), rs.Tier())
	if err != nil {
		tb.Fatal(err)
	}
	return ts, rc, b
}

// setup makes a network manager and a runtime for tests; userns runs the
// container tier in per-sandbox user namespaces that own their netns.
func setup(tb testing.TB, userns ...bool) *env {
	tb.Helper()
	withUserNS := len(userns) > 0 && userns[0]
	testutil.RequireRoot(tb)
	base := baseLayers(tb)
	tmp := tb.TempDir()

	src := filepath.Join(tmp, "init.go")
	if err := os.WriteFile(src, []byte(testInit), 0o644); err != nil {
		tb.Fatal(err)
	}
	bin := filepath.Join(tmp, "envd")
	build := exec.Command("go", "build", "-o", bin, src)
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
	build.Dir = tmp
	if out, err := build.CombinedOutput(); err != nil {
		tb.Fatalf("build test init: %v\n%s", err, out)
	}

	// A small top layer over the shared base, to check layer order.
	top := filepath.Join(tmp, "layer")
	if err := os.MkdirAll(filepath.Join(top, "etc"), 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(top, "etc", "agentbox-layer"), []byte("top"), 0o644); err != nil {
		tb.Fatal(err)
	}

	// As the server runs it: the runtime plugs every sandbox's netns.
	netCfg := network.Config{
		Bridge: "abrt0", Subnet: netip.MustParsePrefix("10.97.0.0/24"),
		NetNSDir: filepath.Join(tmp, "netns"), Table: "agentbox_rt_test", Deferred: true,
	}
	nm, err := network.New(netCfg, slog.Default())
	if err != nil {
		tb.Fatal(err)
	}
	if err := nm.Setup(context.Background()); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if l, err := netlink.LinkByName(netCfg.Bridge); err == nil {
			_ = netlink.LinkDel(l)
		}
		_ = exec.Command("nft", "delete", "table", "inet", netCfg.Table).Run()
		_ = exec.Command("nft", "delete", "table", "bridge", netCfg.Table).Run()
	})

	e := &env{runcRoot: filepath.Join(tmp, "runc"), runscRoot: filepath.Join(tmp, "runc-runsc"), envd: bin, net: nm, netCfg: netCfg, layers: append(slices.Clone(base), top)}
	e.bcfg = bundle.Config{
		StateDir:     filepath.Join(tmp, "sandboxes"),
		IdmapDir:     e.runcRoot + "-idmap",
		EnvdPath:     bin,
		CgroupParent: "agentbox-test",
		UserNS:       withUserNS,
		HookBinary:   testHookBinary(tb),
	}
	e.rt, e.rc, e.b = e.newRuntime(tb, e.bcfg, nm)
	tb.Cleanup(e.b.ResetIdmaps)
	tb.Cleanup(func() {
		parents, _ := filepath.Glob(filepath.Join(cgroupRoot, "*", e.bcfg.CgroupParent))
		for _, p := range append(parents, filepath.Join(cgroupRoot, e.bcfg.CgroupParent)) {
			_ = os.Remove(p)
		}
	})
	return e
}

// sandbox attaches a network and creates the container; cleanup removes both.
func (e *env) sandbox(tb testing.TB, id string, res runtime.Resources) network.Endpoint {
	tb.Helper()
	ctx := context.Background()
	ep, err := e.net.Attach(ctx, id, network.Policy{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = e.rt.Delete(ctx, id)
		_ = e.net.Detach(ctx, id)
	})
	spec := runtime.Spec{ID: id, Layers: e.layers, NetNSPath: ep.NetNSPath, DNS: e.net.DNS(), Resources: res}
	if err := e.rt.Create(ctx, spec); err != nil {
		tb.Fatal(err)
	}
	return ep
}

func get(tb testing.TB, ep network.Endpoint, path string) string {
	tb.Helper()
	url := fmt.Sprintf("http://%s/%s", netip.AddrPortFrom(ep.IP, 49983), path)
	var lastErr error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		resp, err := http.Get(url)
		if err != nil {
			lastErr = err
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return string(b)
	}
	tb.Fatalf("GET %s: %v", url, lastErr)
	return ""
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func TestSandboxLifecycle(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	const id = "rt1sandbox"
	ep := e.sandbox(t, id, runtime.Resources{CPUCount: 1, MemoryMB: 256, PIDs: 128})

	if st, err := e.rt.State(ctx, id); err != nil || st != runtime.StatusRunning {
		t.Fatalf("State = %q, %v; want running", st, err)
	}
	if got := get(t, ep, "hostname"); got != id {
		t.Errorf("hostname = %q, want %q", got, id)
	}
	if got := get(t, ep, "read?p=/etc/agentbox-layer"); got != "top" {
		t.Errorf("top layer file = %q", got)
	}
	if got := get(t, ep, "read?p=/etc/hosts"); !strings.Contains(got, "127.0.1.1\t"+id) {
		t.Errorf("/etc/hosts = %q", got)
	}
	if got := get(t, ep, "read?p=/etc/os-release"); !strings.Contains(got, "Debian") {
		t.Errorf("base layer /etc/os-release = %q", got)
	}

	dir := e.b.Dir(id)
	t.Run("host paths do not name the sandbox", func(t *testing.T) {
		if filepath.Base(dir) == id {
			t.Fatalf("bundle dir %s is named by the id", dir)
		}
		// The runtime's mounts (overlay, disk, idmapped layers); the netns
		// file is the network package's.
		for line := range strings.Lines(readFile(t, "/proc/self/mountinfo")) {
			if (strings.Contains(line, e.bcfg.StateDir) || strings.Contains(line, " overlay ")) && strings.Contains(line, id) {
				t.Errorf("mountinfo names sandbox %s: %s", id, line)
			}
		}
		cgs, _ := filepath.Glob(filepath.Join(cgroupRoot, "*", e.bcfg.CgroupParent, "*"))
		for _, cg := range cgs {
			if strings.Contains(cg, id) {
				t.Errorf("cgroup %s names the sandbox", cg)
			}
		}
	})

	t.Run("writes land in the upper dir", func(t *testing.T) {
		if got := readFile(t, filepath.Join(dir, "upper", "written-by-init")); got != "hello" {
			t.Errorf("upper file = %q", got)
		}
		if _, err := os.Stat(filepath.Join(e.layers[0], "written-by-init")); err == nil {
			t.Error("write reached the base layer")
		}
		if got := readFile(t, filepath.Join(dir, "log", "envd.log")); got != "test init started" {
			t.Errorf("envd log = %q", got)
		}
	})

	t.Run("cgroup limits", func(t *testing.T) {
		cg := e.b.CgroupPath(id)
		var files map[string]string
		if cgroupV2() {
			files = map[string]string{
				"memory.max": "268435456", "memory.swap.max": "0", "pids.max": "128", "cpu.max": "100000 100000",
			}
			for f, want := range files {
				if got := readFile(t, filepath.Join(cgroupRoot, cg, f)); got != want {
					t.Errorf("%s = %q, want %q", f, got, want)
				}
			}
			return
		}
		for _, c := range []struct{ ctrl, file, want string }{
			{"memory", "memory.limit_in_bytes", "268435456"},
			{"memory", "memory.memsw.limit_in_bytes", "268435456"},
			{"pids", "pids.max", "128"},
			{"cpu", "cpu.cfs_quota_us", "100000"},
			{"cpu", "cpu.cfs_period_us", "100000"},
			{"cpu", "cpu.shares", "1024"},
		} {
			p := filepath.Join(cgroupRoot, c.ctrl, cg, c.file)
			if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) && c.file == "memory.memsw.limit_in_bytes" {
				continue // kernel without swap accounting
			}
			if got := readFile(t, p); got != c.want {
				t.Errorf("%s/%s = %q, want %q", c.ctrl, c.file, got, c.want)
			}
		}
	})

	t.Run("container named by its key", func(t *testing.T) {
		// runc's command lines are world-readable while they run: they
		// must not name the sandbox.
		if _, err := os.Stat(filepath.Join(e.runcRoot, id)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("runc state named after the sandbox id: %v", err)
		}
		if cid := e.rc.CID(id); cid == id || len(cid) != 32 {
			t.Errorf("container name %q, want a 32-hex key", cid)
		} else if _, err := os.Stat(filepath.Join(e.runcRoot, cid, "state.json")); err != nil {
			t.Errorf("no runc state under the key: %v", err)
		}
	})

	t.Run("inside", func(t *testing.T) {
		script := `set -e
for d in null zero full random urandom tty ptmx pts shm mqueue; do test -e /dev/$d; done
test "$(hostname)" = "$(cat /etc/hostname)"
! touch /sys/x 2>/dev/null
! touch /.agentbox/bin/envd 2>/dev/null
ulimit -n
echo ok > /tmp/f && sudo -n -u nobody true && echo SUDO_OK`
		out, err := exec.Command(e.rc.cfg.Binary, "--root", e.runcRoot, "exec", e.rc.CID(id), "/bin/sh", "-c", script).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "SUDO_OK") {
			t.Fatalf("in-sandbox checks: %v\n%s", err, out)
		}
		if got := strings.Fields(string(out))[0]; got != fmt.Sprint(e.b.NOFILE()) {
			t.Errorf("ulimit -n = %s, want %d", got, e.b.NOFILE())
		}
	})

	t.Run("stats", func(t *testing.T) {
		st, err := e.rt.Stats(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if st.MemoryUsed+st.MemoryCache == 0 || st.MemoryLimit != 256<<20 || st.CPUUsageNanos == 0 || st.DiskUsed == 0 || st.DiskTotal == 0 {
			t.Errorf("Stats = %+v", st)
		}
	})

	// A second driver on the same directories plays the restarted server.
	r2, _, _ := e.newRuntime(t, e.bcfg, e.net)
	ids, err := r2.List(ctx)
	if err != nil || !slices.Contains(ids, id) {
		t.Fatalf("List after restart = %v, %v", ids, err)
	}
	if st, err := r2.State(ctx, id); err != nil || st != runtime.StatusRunning {
		t.Fatalf("State after restart = %q, %v", st, err)
	}
	if err := r2.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := r2.Delete(ctx, id); err != nil {
		t.Fatalf("second Delete: %v", err)
	}
	assertGone(t, e, id)
}

// assertGone checks that nothing of sandbox id is left on the host.
func assertGone(t *testing.T, e *env, id string) {
	t.Helper()
	dir := e.b.Dir(id)
	if mi := readFile(t, "/proc/self/mountinfo"); strings.Contains(mi, dir) {
		t.Errorf("mount left under %s", dir)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("bundle dir left: %v", err)
	}
	if _, err := os.Stat(filepath.Join(e.runcRoot, e.rc.CID(id))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("runc state left: %v", err)
	}
	if _, err := e.rt.State(context.Background(), id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("State after Delete: %v, want ErrNotFound", err)
	}
	matches, _ := filepath.Glob(filepath.Join(cgroupRoot, "*", e.bcfg.CgroupParent, id))
	matches2, _ := filepath.Glob(filepath.Join(cgroupRoot, e.bcfg.CgroupParent, id))
	if left := append(matches, matches2...); len(left) > 0 {
		t.Errorf("cgroups left: %v", left)
	}
	ids, _ := e.rt.List(context.Background())
	if slices.Contains(ids, id) {
		t.Errorf("List still has %s", id)
	}
}

func TestCreateRollsBack(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	tests := []struct {
		name   string
		id     string
		mutate func(*runtime.Spec)
		envd   string
	}{
		{name: "missing layer", id: "rbLayer", mutate: func(s *runtime.Spec) { s.Layers = []string{"/nonexistent-layer"} }},
		{name: "runc fails", id: "rbRunc", envd: "/nonexistent-envd"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rt := e.rt
			if tc.envd != "" {
				cfg := e.bcfg
				cfg.EnvdPath = tc.envd
				rt, _, _ = e.newRuntime(t, cfg, e.net)
			}
			spec := runtime.Spec{ID: tc.id, Layers: e.layers, Resources: runtime.Resources{MemoryMB: 64}}
			if tc.mutate != nil {
				tc.mutate(&spec)
			}
			if err := rt.Create(ctx, spec); err == nil {
				t.Fatal("Create succeeded")
			} else {
				t.Logf("Create: %v", err)
			}
			assertGone(t, e, tc.id)
		})
	}
	if err := e.rt.Create(ctx, runtime.Spec{ID: "../x", Layers: e.layers}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("bad id: %v", err)
	}
}

// BenchmarkCreateDelete measures a full Create and Delete, Create alone, and
// the floor: runc run --detach of the same init on an already built bundle.
func BenchmarkCreateDelete(b *testing.B) {
	e := setup(b)
	ctx := context.Background()
	ep, err := e.net.Attach(ctx, "bench", network.Policy{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = e.net.Detach(ctx, "bench") })
	spec := func(id string) runtime.Spec {
		return runtime.Spec{ID: id, Layers: e.layers, NetNSPath: ep.NetNSPath,
			Resources: runtime.Resources{CPUCount: 1, MemoryMB: 256, PIDs: 128}}
	}
	b.Run("CreateDelete", func(b *testing.B) {
		for b.Loop() {
			if err := e.rt.Create(ctx, spec("bench-cd")); err != nil {
				b.Fatal(err)
			}
			if err := e.rt.Delete(ctx, "bench-cd"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Create", func(b *testing.B) {
		for b.Loop() {
			if err := e.rt.Create(ctx, spec("bench-c")); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if err := e.rt.Delete(ctx, "bench-c"); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	})
	b.Run("RawRuncRun", func(b *testing.B) {
		const id = "bench-raw"
		if err := e.rt.Create(ctx, spec(id)); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = e.rt.Delete(ctx, id) })
		dir := e.b.Dir(id)
		runc := func(args ...string) error {
			cmd := exec.Command(e.rc.cfg.Binary, append([]string{"--root", e.runcRoot}, args...)...)
			if out, err := cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("runc %v: %v: %s", args, err, out)
			}
			return nil
		}
		for b.Loop() {
			b.StopTimer()
			_ = runc("kill", e.rc.CID(id), "KILL")
			if err := runc("delete", "--force", e.rc.CID(id)); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			cmd := exec.Command(e.rc.cfg.Binary, "--root", e.runcRoot, "run", "--detach", "--bundle", dir, e.rc.CID(id))
			if err := cmd.Run(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func TestStateAndDeleteOfPausedAndStopped(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	tests := []struct {
		id   string
		runc []string // turns the running sandbox into the state under test
		want runtime.Status
	}{
		{id: "running1", want: runtime.StatusRunning},
		{id: "paused1", runc: []string{"pause"}, want: runtime.StatusPaused},
		{id: "stopped1", runc: []string{"kill", "KILL"}, want: runtime.StatusStopped},
	}
	for _, tc := range tests {
		t.Run(tc.id, func(t *testing.T) {
			e.sandbox(t, tc.id, runtime.Resources{MemoryMB: 128})
			if len(tc.runc) > 0 {
				args := append([]string{"--root", e.runcRoot, tc.runc[0], e.rc.CID(tc.id)}, tc.runc[1:]...)
				if out, err := exec.Command(e.rc.cfg.Binary, args...).CombinedOutput(); err != nil {
					t.Fatalf("runc %v: %v: %s", tc.runc, err, out)
				}
			}
			var got runtime.Status
			for range 100 { // a killed init needs a moment to be reaped
				var err error
				if got, err = e.rt.State(ctx, tc.id); err != nil {
					t.Fatal(err)
				}
				if got == tc.want {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			if got != tc.want {
				t.Fatalf("State = %q, want %q", got, tc.want)
			}
			// The answer without runc: sure of running only when it is.
			if _, sure := e.rc.runningInit(tc.id); sure != (tc.want == runtime.StatusRunning) {
				t.Fatalf("runningInit = %v for a %s sandbox", sure, tc.want)
			}
			if err := e.rt.Delete(ctx, tc.id); err != nil {
				t.Fatal(err)
			}
			assertGone(t, e, tc.id)
		})
	}
}

// An idmapped layer stays while an overlay uses it and goes with the last.
func TestReleaseIdmaps(t *testing.T) {
	e := setup(t, true)
	ctx := t.Context()
	e.sandbox(t, "idm1", runtime.Resources{})
	mounted := func() int {
		b, _ := os.ReadFile("/proc/self/mountinfo")
		return strings.Count(string(b), " "+e.bcfg.IdmapDir+"/")
	}
	if n := mounted(); n != len(e.layers) {
		t.Fatalf("%d idmapped layers while a sandbox runs, want %d", n, len(e.layers))
	}
	// Removing another sandbox releases the idmapped layers no overlay uses.
	if err := e.b.Remove("idm2"); err != nil {
		t.Fatal(err)
	}
	if n := mounted(); n != len(e.layers) {
		t.Fatalf("release took %d layers in use down to %d", len(e.layers), n)
	}
	if err := e.rt.Delete(ctx, "idm1"); err != nil {
		t.Fatal(err)
	}
	if n := mounted(); n != 0 {
		t.Fatalf("%d idmapped layers left after the last sandbox", n)
	}
}
