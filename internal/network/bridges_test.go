package network

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/testutil"
)

func TestBridgeName(t *testing.T) {
	for _, tc := range []struct {
		bridge string
		i      int
		want   string
	}{
		{"agentbox0", 0, "agentbox0"},
		{"agentbox0", 1, "agentbox0-1"},
		{"agentbox0", 65, "agentbox0-65"},
		{"abcdefghijklmno", 0, "abcdefghijklmno"},
	} {
		if got := bridgeName(tc.bridge, tc.i); got != tc.want {
			t.Errorf("bridgeName(%q, %d) = %q, want %q", tc.bridge, tc.i, got, tc.want)
		}
	}
	// Too long for a suffix: derived names fit, and two long bridges
	// sharing a prefix do not share overflow bridges.
	a, b := bridgeName("agentbox-long-a", 3), bridgeName("agentbox-long-b", 3)
	if len(a) > 15 || len(b) > 15 || a == b {
		t.Errorf("derived names %q and %q: want distinct names of at most 15 bytes", a, b)
	}
	if n := bridgeName("agentbox-long-a", 16383); len(n) > 15 {
		t.Errorf("derived name %q longer than 15 bytes", n)
	}
	for _, tc := range []struct {
		subnet string
		want   int
	}{{"10.0.0.0/24", 1}, {"10.0.0.0/22", 2}, {"10.0.0.0/20", 5}, {"10.0.0.0/16", 66}} {
		if got := bridgeCount(netip.MustParsePrefix(tc.subnet), bridgePorts); got != tc.want {
			t.Errorf("bridgeCount(%s) = %d, want %d", tc.subnet, got, tc.want)
		}
	}
}

// capture reads the IPv4 packets that reach the bridge's own stack (after
// the bridge-family rules) and sends their source address and UDP payload
// on the returned channel until ctx ends.
func capture(t *testing.T, ctx context.Context, ifindex int) <-chan string {
	t.Helper()
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM, int(htons(unix.ETH_P_IP)))
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IP), Ifindex: ifindex}); err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	tv := unix.Timeval{Usec: 200_000}
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	out := make(chan string, 64)
	go func() {
		defer unix.Close(fd)
		buf := make([]byte, 2048)
		for ctx.Err() == nil {
			n, _, err := unix.Recvfrom(fd, buf, 0)
			if err != nil || n < 28 || buf[9] != unix.IPPROTO_UDP {
				continue
			}
			hl := int(buf[0]&0x0f) * 4
			src, _ := netip.AddrFromSlice(buf[12:16])
			select {
			case out <- src.String() + " " + string(buf[hl+8:n]):
			default:
			}
		}
	}()
	return out
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// TestBeyondOneBridge attaches more sandboxes than a Linux bridge takes
// ports: those past the first bridge's share go on an overflow bridge,
// reach the host, stay isolated and spoof-protected, and detaching them
// all leaves nothing.
func TestBeyondOneBridge(t *testing.T) {
	cfg := Config{Bridge: "abtestov", Subnet: netip.MustParsePrefix("10.95.0.0/21"), NetNSDir: t.TempDir(), Table: "agentbox_test_ov"}
	overflowScenario(t, cfg, 1030, bridgePorts, false)
}

// TestOverflowBridges is the same with three sandboxes a bridge, and a
// restart in between: the restarted manager finds each sandbox's bridge.
func TestOverflowBridges(t *testing.T) {
	cfg := Config{Bridge: "abtestov2", Subnet: netip.MustParsePrefix("10.95.8.0/24"), NetNSDir: t.TempDir(), Table: "agentbox_test_ov2"}
	overflowScenario(t, cfg, 8, 3, true)
}

// startManagerWith is startManager with perBridge sandboxes a bridge.
func startManagerWith(t *testing.T, cfg Config, perBridge int) *Manager {
	t.Helper()
	testutil.RequireRoot(t)
	cleanupHost(t, cfg)
	m, err := newManager(cfg, nil, perBridge)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Setup(t.Context()); err != nil {
		t.Fatal(err)
	}
	return m
}

func overflowScenario(t *testing.T, cfg Config, n, perBridge int, restart bool) {
	t.Cleanup(func() {
		for i := 1; i < bridgeCount(cfg.Subnet, perBridge); i++ {
			_ = deleteLink(bridgeName(cfg.Bridge, i))
		}
	})
	m := startManagerWith(t, cfg, perBridge)
	ctx := t.Context()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("ov%04d", i)
	}
	each := func(fn func(id string) error) error {
		var wg sync.WaitGroup
		errs := make(chan error, n)
		work := make(chan string)
		for range 8 {
			wg.Go(func() {
				for id := range work {
					if err := fn(id); err != nil {
						errs <- err
					}
				}
			})
		}
		for _, id := range ids {
			work <- id
		}
		close(work)
		wg.Wait()
		close(errs)
		return <-errs
	}
	start := time.Now()
	err := each(func(id string) error { _, err := m.Attach(ctx, id, Policy{}); return err })
	t.Cleanup(func() { _ = each(func(id string) error { return m.Detach(context.Background(), id) }) })
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("attached %d sandboxes in %s", n, time.Since(start).Round(time.Millisecond))

	ports := func(bridge string) int {
		ents, _ := os.ReadDir(filepath.Join("/sys/class/net", bridge, "brif"))
		return len(ents)
	}
	over := bridgeName(cfg.Bridge, 1)
	if a, b := ports(cfg.Bridge), ports(over); a != perBridge || b != min(perBridge, n-perBridge) {
		t.Fatalf("ports: %s %d, %s %d; want %d and %d", cfg.Bridge, a, over, b, perBridge, min(perBridge, n-perBridge))
	}
	if restart {
		m2 := startManagerWith(t, cfg, perBridge)
		for _, id := range ids {
			if a, b := m.bridgeOfID(id); a != func() int { i, _ := m2.bridgeOfID(id); return i }() {
				t.Errorf("%s on bridge %d (%s), restarted manager says otherwise", id, a, b)
			}
		}
		m = m2
	}
	var first, second []Endpoint
	for _, id := range ids {
		ep, _ := m.Lookup(id)
		if i, _ := m.bridgeOfID(id); i == 1 {
			second = append(second, ep)
		} else {
			first = append(first, ep)
		}
	}
	x, z, y := second[0], second[1], first[0]
	if x.Gateway != m.Gateway() {
		t.Errorf("overflow sandbox's gateway %s, want %s", x.Gateway, m.Gateway())
	}

	hostLn := listen(t, m.Gateway().String()+":0")
	hostPort := uint16(hostLn.Addr().(*net.TCPAddr).Port)
	xLn := inNetNS(t, x.NetNSPath, func() net.Listener { return listen(t, ":0") })
	xAddr := netip.AddrPortFrom(x.IP, uint16(xLn.Addr().(*net.TCPAddr).Port)).String()
	yLn := inNetNS(t, y.NetNSPath, func() net.Listener { return listen(t, ":0") })
	zLn := inNetNS(t, z.NetNSPath, func() net.Listener { return listen(t, ":0") })

	t.Run("host reaches the overflow sandbox", func(t *testing.T) {
		if err := dial(xAddr); err != nil {
			t.Fatalf("host → %s: %v", xAddr, err)
		}
	})
	t.Run("isolated", func(t *testing.T) {
		for _, tc := range []struct {
			name, from, to string
		}{
			{"overflow → gateway", x.NetNSPath, netip.AddrPortFrom(m.Gateway(), hostPort).String()},
			{"overflow → first bridge", x.NetNSPath, netip.AddrPortFrom(y.IP, uint16(yLn.Addr().(*net.TCPAddr).Port)).String()},
			{"overflow → overflow", x.NetNSPath, netip.AddrPortFrom(z.IP, uint16(zLn.Addr().(*net.TCPAddr).Port)).String()},
			{"first bridge → overflow", y.NetNSPath, xAddr},
		} {
			wantRefused(t, tc.name, inNetNS(t, tc.from, func() error { return dial(tc.to) }))
		}
	})
	t.Run("spoof-protected", func(t *testing.T) {
		br, err := netlink.LinkByName(over)
		if err != nil {
			t.Fatal(err)
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		got := capture(t, cctx, br.Attrs().Index)
		time.Sleep(100 * time.Millisecond)
		to := &net.UDPAddr{IP: m.Gateway().AsSlice(), Port: 9}
		err = inNetNS(t, x.NetNSPath, func() error {
			h, err := netlink.NewHandle()
			if err != nil {
				return err
			}
			defer h.Close()
			eth, err := h.LinkByName("eth0")
			if err != nil {
				return err
			}
			if err := h.AddrAdd(eth, &netlink.Addr{IPNet: &net.IPNet{IP: z.IP.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
				return err
			}
			for _, s := range []struct {
				from netip.Addr
				msg  string
			}{{z.IP, "spoofed"}, {x.IP, "genuine"}} {
				c, err := net.DialUDP("udp4", &net.UDPAddr{IP: s.from.AsSlice()}, to)
				if err != nil {
					return err
				}
				_, err = c.Write([]byte(s.msg))
				c.Close()
				if err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		for {
			select {
			case p := <-got:
				if p == z.IP.String()+" spoofed" {
					t.Fatalf("a datagram from %s claiming %s's address reached the host", x.IP, z.IP)
				}
				if p == x.IP.String()+" genuine" {
					return
				}
			case <-cctx.Done():
				t.Fatal("the genuine datagram never reached the bridge")
			}
		}
	})

	start = time.Now()
	if err := each(func(id string) error { return m.Detach(ctx, id) }); err != nil {
		t.Fatal(err)
	}
	t.Logf("detached %d sandboxes in %s", n, time.Since(start).Round(time.Millisecond))
	if _, err := netlink.LinkByName(over); err == nil {
		t.Errorf("overflow bridge %s left after its last sandbox", over)
	}
	links, err := netlink.LinkList()
	for range 10 {
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
		links, err = netlink.LinkList()
	}
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, l := range links {
		names[l.Attrs().Name] = true
	}
	for _, id := range ids {
		if names[m.hostVeth(id)] || names[m.peerVeth(id)] {
			t.Errorf("veth of %s left", id)
		}
	}
	if p := ports(cfg.Bridge); p != 0 {
		t.Errorf("%d ports left on %s", p, cfg.Bridge)
	}
	for _, dir := range []string{cfg.NetNSDir, m.recordDir()} {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if e.Name() != keySecretFile {
				t.Errorf("%s left in %s", e.Name(), dir)
			}
		}
	}
	if ips, err := m.readNoInternet(); err != nil || len(ips) != 0 {
		t.Errorf("no_internet after detaching all: %d elements, %v", len(ips), err)
	}
	c, err := nftablesConn()
	if err != nil {
		t.Fatal(err)
	}
	if p, a := spoofSetSizes(t, c, cfg); p != 0 || a != 0 {
		t.Errorf("anti-spoofing elements after detaching all: %d ports, %d addresses", p, a)
	}
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range routes {
		if r.Dst != nil && cfg.Subnet.Contains(netip.MustParseAddr(r.Dst.IP.String())) {
			if ones, _ := r.Dst.Mask.Size(); ones == 32 {
				t.Errorf("route to %s left", r.Dst)
			}
		}
	}
}

// spoofSetSizes counts the elements of the anti-spoofing sets.
func spoofSetSizes(t *testing.T, c *nftables.Conn, cfg Config) (ports, pairs int) {
	t.Helper()
	bt, _ := bridgeTable(cfg)
	var n [2]int
	for i, name := range []string{portsSet, portAddrsSet} {
		set, err := c.GetSetByName(bt, name)
		if err != nil {
			t.Fatalf("anti-spoofing set %s: %v", name, err)
		}
		es, err := c.GetSetElements(set)
		if err != nil {
			t.Fatalf("anti-spoofing set %s: %v", name, err)
		}
		n[i] = len(es)
	}
	return n[0], n[1]
}

// A full subnet is the limit now: its error names the flag that lifts it.
func TestSubnetFullNamesTheFlag(t *testing.T) {
	m, err := New(Config{Subnet: netip.MustParsePrefix("10.95.9.0/29"), NetNSDir: t.TempDir()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 { // .2 to .6
		if _, err := m.allocate(fmt.Sprintf("s%d", i)); err != nil {
			t.Fatalf("address %d of 5: %v", i+1, err)
		}
	}
	_, err = m.allocate("s5")
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "--subnet") {
		t.Errorf("sixth address in a /29: %v; want ErrResourceExhausted naming --subnet", err)
	}
}

// A deferred sandbox on an overflow bridge is plugged, unplugged (paused)
// and plugged again (resumed) there, and reachable each time; a
// restarted manager puts one without a port (paused) back on a bridge.
func TestOverflowDeferredPlug(t *testing.T) {
	ctx := t.Context()
	cfg := Config{Bridge: "abtestov3", Subnet: netip.MustParsePrefix("10.95.10.0/24"), NetNSDir: t.TempDir(), Table: "agentbox_test_ov3", Deferred: true}
	t.Cleanup(func() {
		for i := 1; i < bridgeCount(cfg.Subnet, 1); i++ {
			_ = deleteLink(bridgeName(cfg.Bridge, i))
		}
	})
	m := startManagerWith(t, cfg, 1)
	var eps []Endpoint
	for _, id := range []string{"dfa", "dfb"} {
		ep, err := m.Attach(ctx, id, Policy{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Detach(context.Background(), id) })
		if err := m.Plug(ctx, id, 0); err != nil {
			t.Fatal(err)
		}
		eps = append(eps, ep)
	}
	over := bridgeName(cfg.Bridge, 1)
	if i, name := m.bridgeOfID("dfb"); i != 1 {
		t.Fatalf("second sandbox on %s, want %s", name, over)
	}
	// Seeded on its own bridge, with that bridge's MAC for the gateway.
	br, err := netlink.LinkByName(over)
	if err != nil {
		t.Fatal(err)
	}
	hostN, _ := netlink.NeighList(br.Attrs().Index, netlink.FAMILY_V4)
	if !slices.ContainsFunc(hostN, func(n netlink.Neigh) bool {
		return n.IP.Equal(eps[1].IP.AsSlice()) && n.HardwareAddr.String() == sandboxMAC("dfb").String()
	}) {
		t.Errorf("no neighbour entry for %s on %s", eps[1].IP, over)
	}
	gwMAC := inNetNS(t, eps[1].NetNSPath, func() string {
		ns, _ := netlink.NeighList(0, netlink.FAMILY_V4)
		for _, n := range ns {
			if n.IP.Equal(m.Gateway().AsSlice()) {
				return n.HardwareAddr.String()
			}
		}
		return ""
	})
	if gwMAC != br.Attrs().HardwareAddr.String() {
		t.Errorf("sandbox's gateway entry %q, want %s's MAC %s", gwMAC, over, br.Attrs().HardwareAddr)
	}
	if err := reachable(t, eps[1].NetNSPath, eps[1].IP); err != nil {
		t.Fatalf("overflow sandbox: %v", err)
	}
	if err := m.Unplug(ctx, "dfb"); err != nil {
		t.Fatal(err)
	}
	m2 := startManagerWith(t, cfg, 1)
	if i, _ := m2.bridgeOfID("dfb"); i != 1 {
		t.Errorf("restarted manager put the paused sandbox on bridge %d, want 1 (bridge 0 is full)", i)
	}
	if err := m2.Plug(ctx, "dfb", 0); err != nil {
		t.Fatal(err)
	}
	if err := reachable(t, eps[1].NetNSPath, eps[1].IP); err != nil {
		t.Fatalf("overflow sandbox plugged again: %v", err)
	}
	for _, id := range []string{"dfa", "dfb"} {
		if err := m2.Detach(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := netlink.LinkByName(over); err == nil {
		t.Errorf("overflow bridge %s left", over)
	}
}
