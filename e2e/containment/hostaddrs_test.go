package containment

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/e2e/harness"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// hostAddrTiers are the tiers whose sandboxes must not reach host addresses
// added while they run; CONTAINMENT_MICROVM=0 leaves the microVM tier out
// (under TCG emulation a microVM takes a minute or more to boot).
func hostAddrTiers() []string {
	out := []string{"container", "gvisor"}
	if os.Getenv("CONTAINMENT_MICROVM") != "0" {
		out = append(out, "microvm")
	}
	return out
}

// TestHostAddressesAddedLater: a host service listens on 0.0.0.0, and
// while sandboxes of every tier run, the host gains addresses the way
// other software on it does: on a link of its own (a test network, a VPN),
// and on the bridge of a second agentbox server running beside this one.
// No sandbox reaches the service through any of them, nor through the
// other server's gateway; the other server's sandboxes and ours reach
// nothing of each other.
func TestHostAddressesAddedLater(t *testing.T) {
	harness.RequireRoot(t)
	if testing.Short() {
		t.Skip("end-to-end")
	}
	srv := harness.Start(t, harness.Name("host-addresses"))
	// The other server opens the private ranges to its own sandboxes, as an
	// operator with a LAN mirror would: its rules must still open no path
	// into or out of this server's sandboxes.
	other := harness.Start(t, harness.Name("host-addresses-other"), harness.Args("--operator-allow", "10.0.0.0/8"))
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()

	// The host service: answers every connection with a line, so a
	// handshake the egress proxy accepted is not taken for a reply.
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp4", "0.0.0.0:0")
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
			_, _ = io.WriteString(c, "host-service\n")
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port

	type box struct {
		tier string
		sb   *agentbox.Sandbox
		ip   string
	}
	create := func(s *harness.Server, tier string) box {
		t.Helper()
		body := map[string]any{"templateID": "base", "timeout": 1800, "isolation": tier}
		st, b, err := s.Do(ctx, s.APIKey, http.MethodPost, "/v2/sandboxes", body)
		if err != nil || st != http.StatusCreated {
			t.Fatalf("create %s sandbox: %d %s %v", tier, st, b, err)
		}
		id := jsonString(t, b, "sandboxID")
		t.Cleanup(func() { _, _, _ = s.Do(context.Background(), s.APIKey, http.MethodDelete, "/sandboxes/"+id, nil) })
		c := agentbox.New(agentbox.WithAPIURL(s.URL), agentbox.WithSandboxURL(s.URL), agentbox.WithAPIKey(s.APIKey))
		sb, err := c.Connect(ctx, id, 0)
		if err != nil {
			t.Fatal(err)
		}
		out, err := sb.Commands.Run(ctx, "hostname -I")
		if err != nil || len(strings.Fields(out.Stdout)) == 0 {
			t.Fatalf("%s sandbox address: %v %v", tier, out, err)
		}
		return box{tier: tier, sb: sb, ip: strings.Fields(out.Stdout)[0]}
	}
	var ours []box
	for _, tier := range hostAddrTiers() {
		ours = append(ours, create(srv, tier))
	}
	theirs := create(other, "container")

	// A listener in each sandbox, for the checks between the two servers.
	const sbPort = 41234
	listenIn := func(b box) {
		t.Helper()
		if _, err := b.sb.Commands.Run(ctx, fmt.Sprintf(`nohup python3 -c '
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", %d)); s.listen(16)
while True:
    c, _ = s.accept(); c.sendall(b"sandbox-service\n"); c.close()' >/dev/null 2>&1 &`, sbPort), agentbox.WithUser("root")); err != nil {
			t.Fatalf("listener in the %s sandbox: %v", b.tier, err)
		}
	}
	for _, b := range append(ours, theirs) {
		listenIn(b)
	}

	// Host addresses that appear while the sandboxes run: on a link of the
	// host's own, and on the other server's bridge; a public-looking, a
	// private and a link-local one on each.
	added := addHostAddrs(t, other.Bridge)
	var targets []string
	for _, a := range added {
		targets = append(targets, net.JoinHostPort(a.String(), strconv.Itoa(port)))
	}
	targets = append(targets, net.JoinHostPort(other.Subnet.Addr().Next().String(), strconv.Itoa(port)))
	// The control: the host service answers on every one of them, so a
	// refusal below is the sandbox policy's doing.
	for _, a := range targets {
		c, err := net.DialTimeout("tcp4", a, 3*time.Second)
		if err != nil {
			t.Fatalf("control: the host service does not answer on %s: %v", a, err)
		}
		c.Close()
	}

	// reach prints every target that answered with a byte.
	reachAll := func(b box, addrs []string) []string {
		t.Helper()
		script := reach + `for a in ` + strings.Join(addrs, " ") + `; do reach ${a%:*} ${a##*:} && echo "reached $a"; done; true`
		res, err := b.sb.Commands.Run(ctx, script, agentbox.WithUser("root"), agentbox.WithTimeout(5*time.Minute))
		if err != nil {
			t.Fatalf("%s: probe: %v", b.tier, err)
		}
		var got []string
		for _, l := range strings.Split(res.Stdout, "\n") {
			if a, ok := strings.CutPrefix(l, "reached "); ok {
				got = append(got, a)
			}
		}
		return got
	}
	for _, b := range ours {
		t.Run(b.tier+"/host addresses added later", func(t *testing.T) {
			if got := reachAll(b, targets); len(got) > 0 {
				t.Errorf("the %s sandbox reached the host service through %v", b.tier, got)
			}
		})
		t.Run(b.tier+"/the other server's sandbox", func(t *testing.T) {
			if got := reachAll(b, []string{theirs.ip + ":" + strconv.Itoa(sbPort), theirs.ip + ":49983"}); len(got) > 0 {
				t.Errorf("the %s sandbox reached the other server's sandbox at %v", b.tier, got)
			}
		})
	}
	t.Run("the other server's sandbox into ours", func(t *testing.T) {
		var addrs []string
		for _, b := range ours {
			addrs = append(addrs, b.ip+":"+strconv.Itoa(sbPort), b.ip+":49983")
		}
		addrs = append(addrs, targets...)
		if got := reachAll(theirs, addrs); len(got) > 0 {
			t.Errorf("the other server's sandbox reached %v", got)
		}
	})

	// Addresses come and go: after they are removed and others added, the
	// new ones are closed too.
	for _, a := range added {
		delHostAddr(a)
	}
	again := addHostAddrs(t, other.Bridge)
	targets = targets[:0]
	for _, a := range again {
		targets = append(targets, net.JoinHostPort(a.String(), strconv.Itoa(port)))
	}
	for _, b := range ours {
		t.Run(b.tier+"/host addresses added again", func(t *testing.T) {
			if got := reachAll(b, targets); len(got) > 0 {
				t.Errorf("the %s sandbox reached the host service through %v", b.tier, got)
			}
		})
	}
}

// addHostAddrs adds three host addresses to a veth of the host's own and
// three to bridge, each random within its range, and removes them when t
// ends.
func addHostAddrs(t *testing.T, bridge string) []netip.Addr {
	t.Helper()
	// The host's own link: one end of a veth pair, both ends on the host
	// (some kernels have no dummy links), named per test process so that
	// runs of several worktrees do not share it.
	hostLink := fmt.Sprintf("abh%05d", os.Getpid()%100000)
	l, err := netlink.LinkByName(hostLink)
	if err != nil {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostLink}, PeerName: hostLink + "p"}); err != nil && !errors.Is(err, unix.EEXIST) {
			t.Fatalf("host link: %v", err)
		}
		if l, err = netlink.LinkByName(hostLink); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = netlink.LinkDel(l) })
	}
	if err := netlink.LinkSetUp(l); err != nil {
		t.Fatal(err)
	}
	br, err := netlink.LinkByName(bridge)
	if err != nil {
		t.Fatalf("the other server's bridge %s: %v", bridge, err)
	}
	var out []netip.Addr
	for _, link := range []netlink.Link{l, br} {
		for _, base := range []string{"198.18.250.0", "172.31.250.0", "169.254.250.0"} {
			a := randomIn(netip.MustParsePrefix(base + "/24"))
			addr := &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(32, 32)}}
			if err := netlink.AddrAdd(link, addr); err != nil {
				t.Fatalf("add %s to %s: %v", a, link.Attrs().Name, err)
			}
			t.Cleanup(func() { delHostAddr(a) })
			out = append(out, a)
		}
	}
	return out
}

func randomIn(p netip.Prefix) netip.Addr {
	b := make([]byte, 1)
	_, _ = rand.Read(b)
	a := p.Addr().As4()
	a[3] = 2 + b[0]%250
	return netip.AddrFrom4(a)
}

// delHostAddr removes a from whichever host link holds it.
func delHostAddr(a netip.Addr) {
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return
	}
	for _, x := range addrs {
		if x.IP.Equal(a.AsSlice()) {
			if l, err := netlink.LinkByIndex(x.LinkIndex); err == nil {
				_ = netlink.AddrDel(l, &x)
			}
		}
	}
}

func jsonString(t *testing.T, b []byte, field string) string {
	t.Helper()
	key := `"` + field + `":"`
	i := strings.Index(string(b), key)
	if i < 0 {
		t.Fatalf("no %s in %s", field, b)
	}
	rest := string(b[i+len(key):])
	return rest[:strings.IndexByte(rest, '"')]
}
