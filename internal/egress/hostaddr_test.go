package egress

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/network"
)

// TestProxyNeverDialsTheHost: whatever the proxy decided, the kernel
// refuses its connections to the host's own addresses when they are made,
// an address the host gained a moment ago included (the proxy's view of
// the host's addresses may be seconds old; the kernel's is not).
func TestProxyNeverDialsTheHost(t *testing.T) {
	e := newEnv(t, network.Policy{AllowInternet: true})
	ctx := context.Background()
	ln, err := net.Listen("tcp4", "0.0.0.0:0")
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
	port := uint16(ln.Addr().(*net.TCPAddr).Port)

	// A host address that appears after the proxy last looked.
	e.eg.local.has(netip.MustParseAddr("192.0.2.1"))
	const link = "abegrh0"
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: link}, PeerName: link + "p"}); err != nil && !errors.Is(err, unix.EEXIST) {
		t.Fatal(err)
	}
	l, err := netlink.LinkByName(link)
	if err != nil {
		t.Fatal(err)
	}
	defer netlink.LinkDel(l)
	added := netip.MustParseAddr("198.51.100.231")
	if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: added.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(l); err != nil {
		t.Fatal(err)
	}
	if e.eg.platformDenied(added) != "" {
		t.Fatal("the proxy's view of the host's addresses is not stale: this test would not test the kernel")
	}

	b := e.eg.byID["egs"]
	for _, a := range []netip.Addr{added, e.nw.Gateway(), netip.MustParseAddr("127.0.0.1")} {
		dst := netip.AddrPortFrom(a, port)
		// The control: the host service answers on dst to anyone else.
		c, err := net.DialTimeout("tcp4", dst.String(), 2*time.Second)
		if err != nil {
			t.Fatalf("control: %s: %v", dst, err)
		}
		c.Close()
		start := time.Now()
		c, err = e.eg.dial(ctx, b, dst)
		if err == nil {
			got, _ := io.ReadAll(io.LimitReader(c, 64))
			c.Close()
			t.Errorf("the proxy reached the host service at %s: %q", dst, got)
			continue
		}
		if !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, syscall.EPERM) || time.Since(start) > time.Second {
			t.Errorf("proxy dial of %s: %v after %s, want a refusal at once", dst, err, time.Since(start))
		}
	}
}
