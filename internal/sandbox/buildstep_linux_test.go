package sandbox

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/network"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/bundle"
	"github.com/agentbox/agentbox/internal/runtime/runc"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/template"
	"github.com/agentbox/agentbox/internal/testutil"
)

// realStack is a manager on the real runtime (runc, user namespace),
// network (bridge, deferred netns, nftables) and envd, with the shared
// base template: what `agentbox serve` runs, without its HTTP side.
func realStack(t *testing.T) (*Manager, *template.Template, netip.Addr) {
	t.Helper()
	testutil.RequireRoot(t)
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	tplDir := os.Getenv("AGENTBOX_TEMPLATE_DIR")
	if tplDir == "" {
		tplDir = "/var/cache/agentbox/templates"
	}
	tpls, err := template.NewStore(tplDir, log)
	if err != nil {
		t.Fatal(err)
	}
	base, err := tpls.Get(ctx, "", "base")
	if err != nil {
		// First use on this host: build it where every suite finds it.
		t.Logf("building the base template in %s", tplDir)
		if base, err = tpls.Build(ctx, template.BuiltinDefinitions()["base"], nil, io.Discard); err != nil {
			t.Fatalf("build base template: %v", err)
		}
	}
	tmp := t.TempDir()
	envd := filepath.Join(tmp, "envd")
	build := exec.Command("go", "build", "-o", envd, "../../cmd/envd")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build envd: %v\n%s", err, out)
	}
	// The runtime's hooks (netns plug, user namespace limits) are the
	// agentbox binary's hidden __hook subcommand.
	hookBin := filepath.Join(tmp, "agentbox")
	if out, err := exec.Command("go", "build", "-o", hookBin, "../../cmd/agentbox").CombinedOutput(); err != nil {
		t.Fatalf("build agentbox: %v\n%s", err, out)
	}
	subnet := netip.MustParsePrefix("10.96.77.0/24")
	netCfg := network.Config{Bridge: "abpipe0", Subnet: subnet, NetNSDir: filepath.Join(tmp, "netns"), Table: "agentbox_pipeline_test", Deferred: true}
	nw, err := network.New(netCfg, log)
	if err != nil {
		t.Fatal(err)
	}
	if err := nw.Setup(ctx); err != nil {
		t.Fatal(err)
	}
	runcRoot := filepath.Join("/run", "agentbox-pipeline-test", "runc")
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(netCfg.Bridge); err == nil {
			_ = netlink.LinkDel(l)
		}
		_ = exec.Command("nft", "delete", "table", "inet", netCfg.Table).Run()
		_ = exec.Command("nft", "delete", "table", "bridge", netCfg.Table).Run()
		idmaps, _ := os.ReadDir(runcRoot + "-idmap")
		for _, e := range idmaps {
			p := filepath.Join(runcRoot+"-idmap", e.Name())
			for range 100 {
				if unix.Unmount(p, unix.MNT_DETACH) != nil {
					break
				}
			}
		}
		_ = os.RemoveAll(filepath.Dir(runcRoot))
	})
	bundles, err := bundle.New(bundle.Config{
		StateDir: filepath.Join(tmp, "sandboxes"), IdmapDir: runcRoot + "-idmap", CgroupParent: "agentbox-pipeline-test",
		EnvdPath: envd, UserNS: true, HookBinary: hookBin,
	}, log)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := runc.New(runc.Config{Bundles: bundles, Root: runcRoot, Net: nw}, log)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := runtime.NewTiers(rc.Tier())
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(ctx, filepath.Join(tmp, "a.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	m, err := New(ctx, Options{Log: log, Store: st, Runtime: rt, Network: nw, Templates: tpls,
		Lifecycle: LifecycleConfig{SnapshotDir: filepath.Join(tmp, "snapshots")}})
	if err != nil {
		t.Fatal(err)
	}
	return m, base, subnet.Addr().Next()
}

const (
	metadataAddr = "169.254.169.254"
	privateAddr  = "172.31.254.1"
)

// TestRunStepsRealRuntime runs build steps as sandboxes on the real
// runtime: a step's files are captured; reaching the host (its bridge
// address, the metadata address), raw sockets and device nodes fail the
// step exactly as in any sandbox.
func TestRunStepsRealRuntime(t *testing.T) {
	m, base, gateway := realStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	team := "buildteam"

	// A host service on every address: the positive control shows the
	// host answers, so a refused step is the sandbox policy's doing.
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	ln, err := lc.Listen(ctx, "tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	// The metadata address and a private one, held by the host itself (on
	// the sandboxes' bridge): without the policy a step would reach the
	// host service through them.
	br, err := netlink.LinkByName("abpipe0")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{metadataAddr, privateAddr} {
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(a).To4(), Mask: net.CIDRMask(32, 32)}}
		if err := netlink.AddrAdd(br, addr); err != nil {
			t.Fatalf("add %s to the bridge: %v", a, err)
		}
		defer netlink.AddrDel(br, addr)
	}
	for _, a := range []string{gateway.String(), metadataAddr, privateAddr} {
		c, err := net.DialTimeout("tcp4", fmt.Sprintf("%s:%d", a, port), 2*time.Second)
		if err != nil {
			t.Fatalf("control: the host service does not answer on %s: %v", a, err)
		}
		c.Close()
	}

	run := func(name string, cmds ...string) (string, string, error) {
		upper := filepath.Join(t.TempDir(), "upper")
		var out bytes.Buffer
		req := template.StepRequest{TeamID: team, BuildID: "b-" + name, Layers: base.Layers, UpperDir: upper, Output: &out}
		for i, c := range cmds {
			req.Commands = append(req.Commands, template.StepCommand{Line: i + 1, Cmd: c})
		}
		err := m.RunSteps(ctx, req)
		return upper, out.String(), err
	}

	t.Run("writes a file", func(t *testing.T) {
		upper, out, err := run("write", "mkdir -p /opt/app && echo built > /opt/app/out.txt", "mknod /tmp/fifo p && echo fifo-ok")
		if err != nil {
			t.Fatalf("steps: %v\n%s", err, out)
		}
		b, err := os.ReadFile(filepath.Join(upper, "opt", "app", "out.txt"))
		if err != nil || strings.TrimSpace(string(b)) != "built" {
			t.Fatalf("captured layer lacks the step's file: %q %v", b, err)
		}
		if !strings.Contains(out, "fifo-ok") {
			t.Fatalf("control step output %q", out)
		}
	})

	// Each attack is a step that exits 0 only if it got through.
	for _, tc := range []struct{ name, cmd string }{
		{"host bridge address", fmt.Sprintf("timeout 5 bash -c 'exec 3<>/dev/tcp/%s/%d'", gateway, port)},
		{"cloud metadata", fmt.Sprintf("timeout 5 bash -c 'exec 3<>/dev/tcp/%s/%d'", metadataAddr, port)},
		{"private range", fmt.Sprintf("timeout 5 bash -c 'exec 3<>/dev/tcp/%s/%d'", privateAddr, port)},
		{"raw socket", `python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP); print("RAW-OK")'`},
		{"device node", "mknod /tmp/mem c 1 1 && echo MKNOD-OK"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			upper, out, err := run(strings.ReplaceAll(tc.name, " ", "-"), tc.cmd)
			if err == nil {
				t.Fatalf("attack step %q succeeded: a build step crossed the sandbox boundary\n%s", tc.cmd, out)
			}
			if !strings.Contains(err.Error(), "line 1") {
				t.Fatalf("failure does not name the line: %v", err)
			}
			if _, serr := os.Stat(upper); serr == nil {
				t.Fatal("a failed build captured its layer")
			}
			t.Logf("blocked: %v (%s)", err, strings.TrimSpace(out))
		})
	}

	if ids, _ := m.rt.List(context.Background()); len(ids) != 0 {
		t.Fatalf("step sandboxes left in the runtime: %v", ids)
	}
	if ids, _ := m.net.List(context.Background()); len(ids) != 0 {
		t.Fatalf("step sandboxes left in the network: %v", ids)
	}
}
