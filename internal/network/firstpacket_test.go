package network

import (
	"context"
	"net"
	"net/netip"
	"os"
	"strconv"
	"testing"
	"time"
)

// TestFirstPacket: the first datagram each way between the host and a
// sandbox whose Attach (or, deferred, Plug: runc's path) just returned
// arrives (UDP is never resent, so a datagram dropped on the way is gone).
// The bridge has no other port, so every attach brings it up too (see
// linkwatch.go). Without activate about four datagrams in ten were lost.
func TestFirstPacket(t *testing.T) {
	for _, tc := range []struct {
		name     string
		deferred bool
	}{
		{"attached", false},
		{"plugged into a netns owned by the sandbox's user namespace", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Bridge: "abtest5", Subnet: netip.MustParsePrefix("10.99.5.0/24"), NetNSDir: t.TempDir(), Table: "agentbox_test_first", Deferred: tc.deferred}
			firstPackets(t, startManager(t, cfg), tc.deferred)
		})
	}
}

func firstPackets(t *testing.T, m *Manager, deferred bool) {
	ctx := context.Background()
	host, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(m.Gateway(), 0)))
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	hostPort := host.LocalAddr().(*net.UDPAddr).AddrPort()
	const attaches = 30
	var lostOut, lostIn int
	for i := range attaches {
		id := "first" + strconv.Itoa(i)
		ep, err := m.Attach(ctx, id, Policy{AllowInternet: true})
		if err != nil {
			t.Fatal(err)
		}
		if deferred {
			if err := m.Plug(ctx, id, userNetNSProcess(t)); err != nil {
				t.Fatal(err)
			}
		}
		// Out: the rules refuse a sandbox's datagram to the gateway, and
		// the ICMP refusal (which comes back through the bridge) is the
		// proof it arrived.
		type socks struct{ in, out *net.UDPConn }
		s := inNetNS(t, ep.NetNSPath, func() socks {
			in, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(ep.IP, 9999)))
			if err != nil {
				t.Error(err)
				return socks{}
			}
			out, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(hostPort))
			if err != nil {
				in.Close()
				t.Error(err)
				return socks{}
			}
			if _, err := out.Write([]byte(id)); err != nil {
				t.Error(err)
			}
			return socks{in, out}
		})
		if s.in == nil {
			t.FailNow()
		}
		// In: host to sandbox.
		if _, err := host.WriteToUDPAddrPort([]byte(id), netip.AddrPortFrom(ep.IP, 9999)); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 64)
		s.out.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := s.out.Read(buf); err == nil || os.IsTimeout(err) {
			lostOut++
			t.Logf("%s: no refusal of the sandbox's first datagram: %v", id, err)
		}
		s.in.SetReadDeadline(time.Now().Add(2 * time.Second))
		if k, _, err := s.in.ReadFromUDPAddrPort(buf); err != nil || string(buf[:k]) != id {
			lostIn++
			t.Logf("%s: the host's first datagram did not arrive: %v", id, err)
		}
		s.in.Close()
		s.out.Close()
		if err := m.Detach(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if lostOut+lostIn > 0 {
		t.Errorf("of %d new sandboxes, %d lost their first datagram out and %d the host's first one in", attaches, lostOut, lostIn)
	}
}
