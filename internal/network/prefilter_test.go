package network

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/testutil"
)

// countingProxy stands in for the egress proxy: it counts the connections
// nftables hands it and closes them.
type countingProxy struct{ accepted atomic.Int64 }

func (*countingProxy) Bind(string, netip.Addr, Policy) error { return nil }
func (*countingProxy) Unbind(string)                         {}

func listenFreebind(t *testing.T, network string, gw netip.Addr) net.Listener {
	t.Helper()
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_FREEBIND, 1) })
		return errors.Join(err, serr)
	}}
	lc.SetMultipathTCP(false)
	l, err := lc.Listen(context.Background(), network, net.JoinHostPort(gw.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// TestDeniedSynRefused attacks the egress path from a sandbox netns: a
// connection the policy denies by address must be refused at its first SYN (the
// proxy never accepts it), and only ports 80 and 443 of a sandbox with
// domain rules reach the proxy whatever the address.
func TestDeniedSynRefused(t *testing.T) {
	testutil.RequireRoot(t)
	ctx := context.Background()
	cfg := Config{Bridge: "abtest2", Subnet: netip.MustParsePrefix("10.99.2.0/24"), NetNSDir: t.TempDir(), Table: "agentbox_test_prefilter"}
	cleanupHost(t, cfg)
	fake := testutil.NewFakeNet(t, "netpre", netip.MustParsePrefix("198.18.4.0/24"), 2, nil)
	a, b := fake.IPs[0].String(), fake.IPs[1].String()
	m, err := New(cfg, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	px := &countingProxy{}
	ln := listenFreebind(t, "tcp4", m.Gateway())
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			px.accepted.Add(1)
			c.Close()
		}
	}()
	dns := listenFreebind(t, "tcp4", m.Gateway())
	m.SetEgress(px, EgressPorts{Proxy: uint16(ln.Addr().(*net.TCPAddr).Port), DNS: uint16(dns.Addr().(*net.TCPAddr).Port)})
	if err := m.Setup(ctx); err != nil {
		t.Fatal(err)
	}
	ep, err := m.Attach(ctx, "pre", Policy{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Detach(ctx, "pre") })
	host := hostAddr(t, cfg.Subnet)

	// try connects from the sandbox and reports whether the proxy got the
	// connection; a refusal must be ECONNREFUSED at the first SYN.
	try := func(t *testing.T, addr string, wantProxy bool) {
		t.Helper()
		before := px.accepted.Load()
		type result struct {
			err        error
			resent     int // segments TCP resent in the netns during the dial
			counterErr error
		}
		r := inNetNS(t, ep.NetNSPath, func() result {
			n0, err0 := tcpRetransSegs()
			err := dial(addr)
			n1, err1 := tcpRetransSegs()
			return result{err, n1 - n0, errors.Join(err0, err1)}
		})
		if r.counterErr != nil {
			t.Fatal(r.counterErr)
		}
		time.Sleep(20 * time.Millisecond)
		got := px.accepted.Load() > before
		switch err := r.err; {
		case wantProxy && (err != nil || !got):
			t.Errorf("%s: err %v, proxy accepted %v; want it handed to the proxy", addr, err, got)
		case !wantProxy && got:
			t.Errorf("%s: the proxy accepted it; want a refusal at the SYN", addr)
		case !wantProxy && !errors.Is(err, syscall.ECONNREFUSED):
			t.Errorf("%s: %v, want ECONNREFUSED", addr, err)
		case !wantProxy && r.resent > 0:
			// A refusal answers the first SYN; a resent one means the
			// first was lost: dropped by the rules before the refusal,
			// or by a link Attach left inactive (linkwatch.go).
			t.Errorf("%s: refused after TCP resent %d segment(s), want at the first SYN", addr, r.resent)
		}
	}
	steps := []struct {
		name    string
		policy  Policy
		proxied []string
		refused []string
	}{
		{name: "internet off", policy: Policy{},
			refused: []string{a + ":7", a + ":80", a + ":443", b + ":22"}},
		{name: "internet off, one address open", policy: Policy{AllowOut: []netip.Prefix{netip.PrefixFrom(fake.IPs[0], 32)}},
			proxied: []string{a + ":7", a + ":80"}, refused: []string{b + ":7", b + ":80"}},
		{name: "domains: only 80 and 443 wait for a Host or SNI", policy: Policy{AllowDomains: []string{"allowed.test"}},
			proxied: []string{a + ":80", b + ":443"}, refused: []string{a + ":7", b + ":8080"}},
		{name: "internet on, one address denied", policy: Policy{AllowInternet: true, DenyOut: []netip.Prefix{netip.PrefixFrom(fake.IPs[1], 32)}},
			proxied: []string{a + ":7", a + ":80"}, refused: []string{b + ":7", b + ":80", b + ":443"}},
		{name: "header rules alone open nothing", policy: Policy{Rules: []DomainRules{{Pattern: "allowed.test", Transforms: []HeaderTransform{{Headers: map[string]string{"A": "b"}}}}}},
			refused: []string{a + ":80", a + ":443"}},
		{name: "platform ranges whatever the policy", policy: Policy{AllowInternet: true, AllowDomains: []string{"allowed.test"},
			AllowOut: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}},
			proxied: []string{a + ":80"},
			refused: []string{
				m.Gateway().String() + ":22", m.Gateway().String() + ":80",
				net.JoinHostPort(m.Gateway().String(), strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)),
				host.String() + ":22", host.String() + ":443",
				"10.255.255.1:80", "172.16.0.1:443", "192.168.1.1:80", "100.64.0.1:80",
				"169.254.169.254:80", "10.99.2.77:80",
			}},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			if err := m.SetPolicy(ctx, "pre", st.policy); err != nil {
				t.Fatal(err)
			}
			for _, addr := range st.proxied {
				try(t, addr, true)
			}
			for _, addr := range st.refused {
				try(t, addr, false)
			}
		})
	}
}

// tcpRetransSegs reads the TCP segments resent in the calling thread's
// netns so far (RetransSegs in /proc/net/snmp, which counts resent SYNs).
func tcpRetransSegs() (int, error) {
	b, err := os.ReadFile("/proc/thread-self/net/snmp")
	if err != nil {
		return 0, err
	}
	var names []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "Tcp:" {
			continue
		}
		if names == nil {
			names = f
			continue
		}
		for i, name := range names {
			if name == "RetransSegs" && i < len(f) {
				return strconv.Atoi(f[i])
			}
		}
	}
	return 0, errors.New("no RetransSegs in /proc/thread-self/net/snmp")
}
