package network

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/testutil"
)

func TestParseDestinations(t *testing.T) {
	for _, tc := range []struct {
		in      []string
		deny    bool
		want    string // prefixes then domains, space-separated
		wantErr string // substring naming the bad entry
	}{
		{in: []string{"1.2.3.4", "10.0.0.0/8", "ALL_TRAFFIC"}, want: "1.2.3.4/32 10.0.0.0/8 0.0.0.0/0"},
		{in: []string{"10.1.2.3/8"}, want: "10.0.0.0/8"},
		{in: []string{"Example.COM.", "*.example.org", "example.com"}, want: "example.com *.example.org"},
		{in: []string{"ok.com", "1.2.3.4/40"}, wantErr: `allowOut[1]: "1.2.3.4/40"`},
		{in: []string{"10.0.0.300"}, wantErr: `allowOut[0]: "10.0.0.300"`},
		{in: []string{"::1"}, wantErr: "IPv6"},
		{in: []string{"*"}, wantErr: `allowOut[0]: "*"`},
		{in: []string{"a.*.com"}, wantErr: "wildcard"},
		{in: []string{"bad_dom ain.com"}, wantErr: "not a valid domain"},
		{in: []string{"-x.com"}, wantErr: "not a valid domain"},
		{in: []string{"example.com"}, deny: true, wantErr: `denyOut[0]: "example.com": denyOut takes`},
		{in: []string{"0.0.0.0/0", "8.8.8.8"}, deny: true, want: "0.0.0.0/0 8.8.8.8/32"},
	} {
		t.Run(strings.Join(tc.in, ","), func(t *testing.T) {
			var parts []string
			var err error
			if tc.deny {
				var ps []netip.Prefix
				ps, err = ParseDenyOut("denyOut", tc.in)
				for _, p := range ps {
					parts = append(parts, p.String())
				}
			} else {
				var ps []netip.Prefix
				var ds []string
				ps, ds, err = ParseAllowOut("allowOut", tc.in)
				for _, p := range ps {
					parts = append(parts, p.String())
				}
				parts = append(parts, ds...)
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, errdefs.ErrInvalidArgument) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || strings.Join(parts, " ") != tc.want {
				t.Fatalf("got %q, %v; want %q", strings.Join(parts, " "), err, tc.want)
			}
		})
	}
}

func TestDecide(t *testing.T) {
	p := Policy{
		AllowOut:     []netip.Prefix{netip.MustParsePrefix("198.18.0.0/24")},
		AllowDomains: []string{"api.example.com", "*.allowed.org"},
		DenyOut:      []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")},
		Rules: []DomainRules{
			{Pattern: "*.example.com", Transforms: []HeaderTransform{{Headers: map[string]string{"X": "wild"}}}},
			{Pattern: "*.api.example.com", Transforms: []HeaderTransform{{Headers: map[string]string{"X": "longer"}}}},
			{Pattern: "api.example.com", Transforms: []HeaderTransform{{Headers: map[string]string{"X": "exact"}}}},
		},
	}
	other := netip.MustParseAddr("198.18.9.9")
	for _, tc := range []struct {
		name   string
		dst    netip.Addr
		allow  bool
		byName bool
		rule   string
	}{
		{"", netip.MustParseAddr("198.18.0.7"), true, false, "allowOut 198.18.0.0/24"},
		{"evil.com", netip.MustParseAddr("198.18.0.7"), true, false, "allowOut 198.18.0.0/24"},
		{"api.example.com", other, true, true, "allowOut api.example.com"},
		{"API.Example.com.", other, true, true, "allowOut api.example.com"},
		{"x.api.example.com", other, false, false, "denyOut ALL_TRAFFIC"},
		{"a.b.allowed.org", other, true, true, "allowOut *.allowed.org"},
		{"allowed.org", other, false, false, "denyOut ALL_TRAFFIC"},
		{"", other, false, false, "denyOut ALL_TRAFFIC"},
	} {
		v, byName := p.DecideName(tc.name, tc.dst)
		if v.Allow != tc.allow || byName != tc.byName || v.Rule != tc.rule {
			t.Errorf("DecideName(%q, %s) = %+v byName=%v; want allow=%v byName=%v rule %q", tc.name, tc.dst, v, byName, tc.allow, tc.byName, tc.rule)
		}
	}
	for name, want := range map[string]string{"api.example.com": "exact", "a.api.example.com": "longer", "b.example.com": "wild", "example.com": ""} {
		got := ""
		if tr := p.RulesFor(name); len(tr) > 0 {
			got = tr[0].Headers["X"]
		}
		if got != want {
			t.Errorf("RulesFor(%q) = %q, want %q", name, got, want)
		}
	}
	if v := (Policy{AllowInternet: true}).DecideIP(other); !v.Allow {
		t.Errorf("default allow: %+v", v)
	}
}

// udpEcho sends one datagram from src (empty: any) to dst and reports the echo.
func udpEcho(src, dst string) error {
	var laddr *net.UDPAddr
	if src != "" {
		laddr = net.UDPAddrFromAddrPort(netip.MustParseAddrPort(src))
	}
	c, err := net.DialUDP("udp4", laddr, net.UDPAddrFromAddrPort(netip.MustParseAddrPort(dst)))
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("ping")); err != nil {
		return err
	}
	buf := make([]byte, 16)
	_, err = c.Read(buf)
	return err
}

func TestIPPolicy(t *testing.T) {
	testutil.RequireRoot(t)
	ctx := context.Background()
	cfg := Config{Bridge: "abtest1", Subnet: netip.MustParsePrefix("10.99.1.0/24"), NetNSDir: t.TempDir(), Table: "agentbox_test_policy"}
	cleanupHost(t, cfg)
	fake := testutil.NewFakeNet(t, "netpol", netip.MustParsePrefix("198.18.1.0/24"), 3, nil)
	a10, a11 := fake.IPs[0].String(), fake.IPs[1].String()
	m, err := New(cfg, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Setup(ctx); err != nil {
		t.Fatal(err)
	}
	ep, err := m.Attach(ctx, "pol", Policy{AllowInternet: false, AllowOut: []netip.Prefix{netip.PrefixFrom(fake.IPs[0], 32)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Detach(ctx, "pol") })
	in := func(f func() error) error { return inNetNS(t, ep.NetNSPath, f) }
	tcp := func(ip string) error { return in(func() error { return dial(ip + ":7") }) }
	udp := func(ip string) error { return in(func() error { return udpEcho("", ip+":7") }) }

	steps := []struct {
		name   string
		policy *Policy
		open   []string
		closed []string
	}{
		{name: "deny all but one address", open: []string{a10}, closed: []string{a11}},
		{name: "allow all but one address", policy: &Policy{AllowInternet: true, DenyOut: []netip.Prefix{netip.PrefixFrom(fake.IPs[1], 32)}},
			open: []string{a10}, closed: []string{a11}},
		{name: "allowOut wins over denyOut", policy: &Policy{DenyOut: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}, AllowOut: []netip.Prefix{netip.MustParsePrefix("198.18.1.0/24")}},
			open: []string{a10, a11}},
		{name: "denyOut ALL_TRAFFIC", policy: &Policy{AllowInternet: true, DenyOut: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}},
			closed: []string{a10, a11}},
		{name: "allowOut cannot open private or link-local ranges", policy: &Policy{AllowInternet: true, AllowOut: []netip.Prefix{
			netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("169.254.0.0/16"), netip.MustParsePrefix("0.0.0.0/0")}},
			open: []string{a10}, closed: []string{"10.255.255.1", "169.254.169.254", m.Gateway().String()}},
		{name: "back to no rules", policy: &Policy{AllowInternet: true}, open: []string{a10, a11}},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			if st.policy != nil {
				if err := m.SetPolicy(ctx, "pol", *st.policy); err != nil {
					t.Fatal(err)
				}
			}
			for _, ip := range st.open {
				if err := tcp(ip); err != nil {
					t.Errorf("tcp %s: %v", ip, err)
				}
				if err := udp(ip); err != nil && fake.IPs[0].String() == ip {
					t.Errorf("udp %s: %v", ip, err)
				}
			}
			for _, ip := range st.closed {
				wantRefused(t, "tcp "+ip, tcp(ip))
				if ip == a10 || ip == a11 {
					if err := udp(ip); !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, syscall.EHOSTUNREACH) {
						t.Errorf("udp %s: %v, want an immediate ICMP refusal", ip, err)
					}
				}
			}
		})
	}

	t.Run("spoofed source dropped", func(t *testing.T) {
		spoofed := netip.MustParseAddr("10.99.1.200")
		in(func() error {
			l, err := netlink.LinkByName("eth0")
			if err != nil {
				return err
			}
			return netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: spoofed.AsSlice(), Mask: net.CIDRMask(32, 32)}})
		})
		if err := in(func() error { return udpEcho(ep.IP.String()+":0", a10+":7") }); err != nil {
			t.Fatalf("own address: %v", err)
		}
		// A sink on the fake host tells "dropped on the way out" from "the
		// answer got lost".
		sink := fake.Listen(t, "udp4", a10+":9").(net.PacketConn)
		defer sink.Close()
		send := func(src netip.Addr) {
			in(func() error {
				c, err := net.DialUDP("udp4", &net.UDPAddr{IP: src.AsSlice()}, &net.UDPAddr{IP: fake.IPs[0].AsSlice(), Port: 9})
				if err != nil {
					return err
				}
				defer c.Close()
				_, err = c.Write([]byte("hello"))
				return err
			})
		}
		send(ep.IP)
		sink.SetReadDeadline(time.Now().Add(time.Second))
		if _, _, err := sink.ReadFrom(make([]byte, 64)); err != nil {
			t.Fatalf("sink got nothing from the sandbox's own address: %v", err)
		}
		send(spoofed)
		sink.SetReadDeadline(time.Now().Add(time.Second))
		if _, from, err := sink.ReadFrom(make([]byte, 64)); err == nil {
			t.Errorf("a datagram with a spoofed source reached the internet from %s", from)
		}
		var ne net.Error
		err = in(func() error {
			d := net.Dialer{Timeout: time.Second, LocalAddr: &net.TCPAddr{IP: spoofed.AsSlice()}}
			c, err := d.Dial("tcp4", a10+":7")
			if err == nil {
				c.Close()
			}
			return err
		})
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Errorf("spoofed TCP: %v, want a timeout (dropped)", err)
		}
	})

	t.Run("domain rules need the proxy", func(t *testing.T) {
		err := m.SetPolicy(ctx, "pol", Policy{AllowInternet: true, AllowDomains: []string{"example.com"}})
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("SetPolicy with domains and no proxy: %v", err)
		}
	})

	t.Run("detach removes the sandbox's rules", func(t *testing.T) {
		if err := m.SetPolicy(ctx, "pol", Policy{DenyOut: []netip.Prefix{netip.MustParsePrefix("1.2.3.4/32")}}); err != nil {
			t.Fatal(err)
		}
		if err := m.Detach(ctx, "pol"); err != nil {
			t.Fatal(err)
		}
		c, _ := nftablesConn()
		chains, _ := c.ListChains()
		for _, ch := range chains {
			if ch.Table.Name == cfg.Table && strings.HasPrefix(ch.Name, "sb_") {
				t.Errorf("chain %s left", ch.Name)
			}
		}
		if p, a := spoofSetSizes(t, c, cfg); p != 0 || a != 0 {
			t.Errorf("anti-spoofing elements left: %d ports, %d addresses", p, a)
		}
	})
}
