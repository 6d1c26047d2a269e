package egress

import (
	"bufio"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"syscall"
	"time"

	"golang.org/x/net/proxy"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/network"
)

// dial connects to addr for sandbox b: directly, or through its upstream
// proxy. It never falls back to a direct connection.
func (s *Server) dial(ctx context.Context, b *binding, addr netip.AddrPort) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.DialTimeout)
	defer cancel()
	d := &net.Dialer{Control: markEgress}
	d.SetMultipathTCP(false)
	up := b.policy.Upstream
	if up == nil {
		return d.DialContext(ctx, "tcp4", addr.String())
	}
	if err := s.checkUpstream(ctx, up.Address); err != nil {
		return nil, err
	}
	switch up.Scheme {
	case "socks5":
		var auth *proxy.Auth
		if up.Username != "" {
			auth = &proxy.Auth{User: up.Username, Password: up.Password}
		}
		sd, err := proxy.SOCKS5("tcp", up.Address, auth, d)
		if err != nil {
			return nil, fmt.Errorf("egress proxy %s: %w", up.Address, err)
		}
		c, err := sd.(proxy.ContextDialer).DialContext(ctx, "tcp", addr.String())
		if err != nil {
			return nil, fmt.Errorf("egress proxy %s: %w", up.Address, err)
		}
		return c, nil
	case "http":
		c, err := d.DialContext(ctx, "tcp", up.Address)
		if err != nil {
			return nil, fmt.Errorf("egress proxy %s: %w", up.Address, err)
		}
		if dl, ok := ctx.Deadline(); ok {
			_ = c.SetDeadline(dl)
		}
		msg := fmt.Sprintf("CONNECT %s HTTP/1.1\r\nHost: %s\r\n", addr, addr)
		if up.Username != "" {
			msg += "Proxy-Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte(up.Username+":"+up.Password)) + "\r\n"
		}
		if _, err := io.WriteString(c, msg+"\r\n"); err != nil {
			c.Close()
			return nil, fmt.Errorf("egress proxy %s: %w", up.Address, err)
		}
		req := &http.Request{Method: http.MethodConnect}
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, req)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("egress proxy %s: %w", up.Address, err)
		}
		if resp.StatusCode != http.StatusOK {
			c.Close()
			return nil, fmt.Errorf("egress proxy %s refused CONNECT %s: %s", up.Address, addr, resp.Status)
		}
		_ = c.SetDeadline(time.Time{})
		if br.Buffered() > 0 {
			return &bufferedConn{Conn: c, r: br}, nil
		}
		return c, nil
	}
	return nil, fmt.Errorf("egress proxy scheme %q", up.Scheme)
}

// markEgress marks a socket the proxy opens for a sandbox (network.EgressMark),
// so that the kernel refuses it the host's own addresses and every agentbox
// server's sandboxes at the moment it connects: an address the host gained
// after the policy was decided, or another server's sandbox that an
// operator range covers, is never reached through the proxy.
func markEgress(_, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, network.EgressMark)
	})
	if err := errors.Join(err, serr); err != nil {
		return fmt.Errorf("mark the egress socket: %w", err)
	}
	return nil
}

// checkUpstream refuses an upstream proxy inside the platform's denied
// ranges: it would be a way into the host's networks.
func (s *Server) checkUpstream(ctx context.Context, address string) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return fmt.Errorf("egress proxy address %q: %w", address, err)
	}
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a}
	} else if addrs, err = s.resolve(ctx, host); err != nil {
		return fmt.Errorf("egress proxy: %w", err)
	}
	for _, a := range addrs {
		if why := s.platformDenied(a); why != "" {
			return fmt.Errorf("egress proxy %s is not reachable: %s", address, why)
		}
	}
	return nil
}

type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// dialNameserver points Go's resolver at the configured upstreams, in turn.
func (s *Server) dialNameserver(ctx context.Context, network, _ string) (net.Conn, error) {
	if len(s.cfg.Nameservers) == 0 {
		return nil, fmt.Errorf("no upstream nameserver configured")
	}
	i := s.nsNext.Add(1)
	ns := s.cfg.Nameservers[int(i)%len(s.cfg.Nameservers)]
	var d net.Dialer
	return d.DialContext(ctx, network, net.JoinHostPort(ns, "53"))
}
