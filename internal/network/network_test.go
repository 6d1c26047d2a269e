package network

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/agentbox/agentbox/internal/testutil"
)

// inNetNS runs fn on a fresh OS thread inside the netns at path. The thread
// is never unlocked, so Go throws it away afterwards.
func inNetNS[T any](t *testing.T, path string, fn func() T) T {
	t.Helper()
	out := make(chan T, 1)
	errc := make(chan error, 1)
	go func() {
		goruntime.LockOSThread()
		ns, err := netns.GetFromPath(path)
		if err != nil {
			errc <- err
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			errc <- err
			return
		}
		out <- fn()
	}()
	select {
	case v := <-out:
		return v
	case err := <-errc:
		t.Fatalf("enter netns %s: %v", path, err)
	}
	panic("unreachable")
}

// dial reports how a TCP connect ended; a denied connect must fail fast, not
// time out.
func dial(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 3*time.Second)
	if err == nil {
		c.Close()
	}
	return err
}

func wantRefused(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: connected, want refused", what)
		return
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Errorf("%s: timed out (%v), want an immediate refusal", what, err)
	}
}

func listen(t *testing.T, addr string) net.Listener {
	t.Helper()
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	l, err := lc.Listen(context.Background(), "tcp4", addr)
	if err != nil {
		t.Fatalf("listen %s: %v", addr, err)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	t.Cleanup(func() { l.Close() })
	return l
}

// hostAddr returns a global IPv4 address of the host outside the test subnet.
func hostAddr(t *testing.T, subnet netip.Prefix) netip.Addr {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		p, err := netip.ParsePrefix(a.String())
		if err != nil || !p.Addr().Is4() || p.Addr().IsLoopback() || subnet.Contains(p.Addr()) {
			continue
		}
		return p.Addr()
	}
	t.Skip("host has no global IPv4 address")
	return netip.Addr{}
}

func testConfig(t *testing.T) Config {
	return Config{
		Bridge:   "abtest0",
		Subnet:   netip.MustParsePrefix("10.99.0.0/24"),
		NetNSDir: t.TempDir(),
		Table:    "agentbox_test",
	}
}

func cleanupHost(t *testing.T, cfg Config) {
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(cfg.Bridge); err == nil {
			_ = netlink.LinkDel(l)
		}
		c, err := nftablesConn()
		if err == nil {
			c.DelTable(tableOf(cfg))
			_ = c.Flush()
			bt, _ := bridgeTable(cfg)
			c.DelTable(bt)
			_ = c.Flush()
		}
	})
}

// startManager makes a Manager on cfg, sets the host up and undoes it
// when the test ends.
func startManager(t *testing.T, cfg Config) *Manager {
	t.Helper()
	testutil.RequireRoot(t)
	cleanupHost(t, cfg)
	m, err := New(cfg, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Setup(t.Context()); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestIsolation(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig(t)
	m := startManager(t, cfg)
	if err := m.Setup(ctx); err != nil {
		t.Fatalf("second Setup: %v", err)
	}

	a, err := m.Attach(ctx, "sba", Policy{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Detach(ctx, "sba") })
	b, err := m.Attach(ctx, "sbb", Policy{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Detach(ctx, "sbb") })
	if a.IP == b.IP || !cfg.Subnet.Contains(a.IP) || a.Gateway != m.Gateway() {
		t.Fatalf("endpoints %+v %+v", a, b)
	}
	checkSeededNeighbours(t, m, "sbb", b.NetNSPath, b.IP)
	if _, err := m.Attach(ctx, "sba", Policy{}); err == nil {
		t.Fatal("second Attach of the same id succeeded")
	}

	hostLn := listen(t, "0.0.0.0:0")
	port := hostLn.Addr().(*net.TCPAddr).Port
	hostIP := hostAddr(t, cfg.Subnet)
	bLn := inNetNS(t, b.NetNSPath, func() net.Listener { return listen(t, ":0") })
	aLn := inNetNS(t, a.NetNSPath, func() net.Listener { return listen(t, ":0") })

	targets := []struct{ name, addr string }{
		{"host via gateway", netip.AddrPortFrom(a.Gateway, uint16(port)).String()},
		{"host eth0 address", netip.AddrPortFrom(hostIP, uint16(port)).String()},
		{"sandbox B", netip.AddrPortFrom(b.IP, uint16(bLn.Addr().(*net.TCPAddr).Port)).String()},
		{"metadata", "169.254.169.254:80"},
	}
	for _, tc := range targets {
		t.Run(tc.name, func(t *testing.T) {
			wantRefused(t, tc.name, inNetNS(t, a.NetNSPath, func() error { return dial(tc.addr) }))
		})
	}

	t.Run("host reaches sandbox", func(t *testing.T) {
		addr := netip.AddrPortFrom(a.IP, uint16(aLn.Addr().(*net.TCPAddr).Port)).String()
		if err := dial(addr); err != nil {
			t.Fatalf("host → A: %v", err)
		}
	})

	t.Run("internet policy", func(t *testing.T) {
		const public = "203.0.113.80:80"
		if err := dial(public); err != nil {
			t.Skipf("host cannot reach %s: %v", public, err)
		}
		wantRefused(t, "internet denied", inNetNS(t, a.NetNSPath, func() error { return dial(public) }))
		if err := m.SetPolicy(ctx, "sba", Policy{AllowInternet: true}); err != nil {
			t.Fatal(err)
		}
		if err := inNetNS(t, a.NetNSPath, func() error { return dial(public) }); err != nil {
			t.Errorf("internet allowed: %v", err)
		}
		// The host and other sandboxes stay out of reach.
		wantRefused(t, "host with internet", inNetNS(t, a.NetNSPath, func() error { return dial(targets[0].addr) }))
		for _, ns := range m.DNS() {
			addr := net.JoinHostPort(ns, "53")
			if dial(addr) != nil {
				continue // the host itself cannot reach it
			}
			if err := inNetNS(t, a.NetNSPath, func() error { return dial(addr) }); err != nil {
				t.Errorf("nameserver %s with internet: %v", addr, err)
			}
		}
		wantRefused(t, "private range with internet", inNetNS(t, a.NetNSPath, func() error { return dial("10.255.255.1:80") }))
		wantRefused(t, "B with internet", inNetNS(t, a.NetNSPath, func() error { return dial(targets[2].addr) }))
		if err := m.SetPolicy(ctx, "sba", Policy{}); err != nil {
			t.Fatal(err)
		}
		wantRefused(t, "internet denied again", inNetNS(t, a.NetNSPath, func() error { return dial(public) }))
	})

	t.Run("sysctls", func(t *testing.T) {
		got := inNetNS(t, a.NetNSPath, func() string {
			b, _ := os.ReadFile("/proc/sys/net/ipv6/conf/all/disable_ipv6")
			m, _ := os.ReadFile("/proc/sys/net/mptcp/enabled")
			return fmt.Sprintf("%s/%s", b, m)
		})
		if got != "1\n/0\n" && got != "1\n/" {
			t.Errorf("disable_ipv6/mptcp = %q", got)
		}
	})

	t.Run("restart relearns", func(t *testing.T) {
		// gVisor's netstack takes the address off eth0: the restarted
		// manager must still know it, from its address record.
		if out, err := exec.Command("nsenter", "--net="+b.NetNSPath, "ip", "addr", "flush", "dev", "eth0").CombinedOutput(); err != nil {
			t.Fatalf("flush eth0: %v: %s", err, out)
		}
		m2, err := New(cfg, slog.Default())
		if err != nil {
			t.Fatal(err)
		}
		if ep, ok := m2.Lookup("sba"); !ok || ep.IP != a.IP {
			t.Fatalf("Lookup after restart = %+v %v, want %s", ep, ok, a.IP)
		}
		if ep, ok := m2.Lookup("sbb"); !ok || ep.IP != b.IP {
			t.Fatalf("Lookup of a sandbox without an address on eth0 after restart = %+v %v, want %s", ep, ok, b.IP)
		}
		if err := m2.Setup(ctx); err != nil {
			t.Fatal(err)
		}
		denied, err := m2.readNoInternet()
		if err != nil || !slices.Contains(denied, b.IP) {
			t.Errorf("no_internet after re-Setup = %v, %v; want it to keep %s", denied, err, b.IP)
		}
		c, err := m2.Attach(ctx, "sbc", Policy{AllowInternet: true})
		if err != nil {
			t.Fatal(err)
		}
		if c.IP == a.IP || c.IP == b.IP {
			t.Errorf("restarted manager reused %s", c.IP)
		}
		ids, _ := m2.List(ctx)
		if !slices.Equal(ids, []string{"sba", "sbb", "sbc"}) {
			t.Errorf("List = %v", ids)
		}
		if err := m2.Detach(ctx, "sbc"); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("host names hide the id", func(t *testing.T) {
		// Pins are mount points: their paths are in every host user's
		// /proc/self/mountinfo, so they must not name the sandbox.
		mounts, err := os.ReadFile("/proc/self/mountinfo")
		if err != nil {
			t.Fatal(err)
		}
		for _, dir := range []string{cfg.NetNSDir, m.recordDir()} {
			entries, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range entries {
				if strings.Contains(e.Name(), "sba") || strings.Contains(e.Name(), "sbb") {
					t.Errorf("%s/%s is named after a sandbox", dir, e.Name())
				}
			}
		}
		if strings.Contains(string(mounts), filepath.Join(cfg.NetNSDir, "sba")) {
			t.Error("mountinfo shows a netns pin named after its sandbox")
		}
		fi, err := os.Stat(m.recordDir())
		if err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("record dir mode = %v, %v; want 0700", fi.Mode(), err)
		}
		if fi, err := os.Stat(m.addrPath("sba")); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("record mode = %v, %v; want 0600", fi.Mode(), err)
		}
		// A keyed pin whose record is gone cannot be mapped back to a
		// sandbox: a restarted manager removes it.
		orphan := filepath.Join(cfg.NetNSDir, strings.Repeat("ab", 16))
		if err := placeholder(orphan); err != nil {
			t.Fatal(err)
		}
		m2, err := New(cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		if ids, _ := m2.List(ctx); !slices.Equal(ids, []string{"sba", "sbb"}) {
			t.Errorf("List with an orphaned pin = %v", ids)
		}
		if _, err := os.Stat(orphan); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("orphaned pin left: %v", err)
		}
	})

	t.Run("detach", func(t *testing.T) {
		for _, id := range []string{"sba", "sbb"} {
			if err := m.Detach(ctx, id); err != nil {
				t.Fatal(err)
			}
			if err := m.Detach(ctx, id); err != nil {
				t.Fatalf("second Detach: %v", err)
			}
			if _, err := os.Stat(m.addrPath(id)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("address record of %s left after Detach: %v", id, err)
			}
			if _, err := netlink.LinkByName(m.hostVeth(id)); err == nil {
				t.Errorf("%s: veth left", id)
			}
			if _, err := os.Stat(m.nsPath(id)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s: netns file left: %v", id, err)
			}
		}
		denied, err := m.readNoInternet()
		if err != nil || len(denied) != 0 {
			t.Errorf("no_internet after Detach = %v, %v", denied, err)
		}
		ids, _ := m.List(ctx)
		if len(ids) != 0 {
			t.Errorf("List after Detach = %v", ids)
		}
	})
}

func BenchmarkAttachDetach(b *testing.B) {
	testutil.RequireRoot(b)
	ctx := context.Background()
	cfg := Config{Bridge: "abbench0", Subnet: netip.MustParsePrefix("10.98.0.0/24"), NetNSDir: b.TempDir(), Table: "agentbox_bench"}
	m, err := New(cfg, slog.Default())
	if err != nil {
		b.Fatal(err)
	}
	if err := m.Setup(ctx); err != nil {
		b.Fatal(err)
	}
	defer func() {
		if l, err := netlink.LinkByName(cfg.Bridge); err == nil {
			_ = netlink.LinkDel(l)
		}
		if c, err := nftablesConn(); err == nil {
			c.DelTable(tableOf(cfg))
			_ = c.Flush()
		}
	}()
	b.Run("AttachDetach", func(b *testing.B) {
		for b.Loop() {
			if _, err := m.Attach(ctx, "bench", Policy{}); err != nil {
				b.Fatal(err)
			}
			if err := m.Detach(ctx, "bench"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Attach", func(b *testing.B) {
		for b.Loop() {
			if _, err := m.Attach(ctx, "bench", Policy{}); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if err := m.Detach(ctx, "bench"); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	})
}

// TestReusedAddressForgetsOldNeighbour: a new sandbox on an address an
// earlier one had (a restarted server starts next-fit over) must not
// inherit the host's ARP entry for the old MAC.
func TestReusedAddressForgetsOldNeighbour(t *testing.T) {
	cfg := Config{Bridge: "abtest3", Subnet: netip.MustParsePrefix("10.99.3.0/24"), NetNSDir: t.TempDir(), Table: "agentbox_test_neigh"}
	m := startManager(t, cfg)
	ctx := context.Background()
	br, err := netlink.LinkByName(cfg.Bridge)
	if err != nil {
		t.Fatal(err)
	}
	// A sandbox already on the bridge: it has carrier, so the kernel does
	// not flush its neighbour table when the next port comes up.
	if _, err := m.Attach(ctx, "sbfirst", Policy{AllowInternet: true}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Detach(ctx, "sbfirst") })
	old, _ := net.ParseMAC("02:00:00:00:00:99")
	// Every address the first attach may get holds a stale entry.
	for a := m.gateway.Next(); cfg.Subnet.Contains(a) && a.As4()[3] < 10; a = a.Next() {
		if err := netlink.NeighSet(&netlink.Neigh{LinkIndex: br.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_REACHABLE, IP: a.AsSlice(), HardwareAddr: old}); err != nil {
			t.Fatal(err)
		}
	}
	ep, err := m.Attach(ctx, "sbn", Policy{AllowInternet: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Detach(ctx, "sbn") })
	neighs, err := netlink.NeighList(br.Attrs().Index, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range neighs {
		if ip, _ := netip.AddrFromSlice(n.IP.To4()); ip == ep.IP && n.HardwareAddr.String() == old.String() {
			t.Fatalf("%s still resolves to the old MAC %s", ep.IP, old)
		}
	}
}
