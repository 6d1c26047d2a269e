// Package egress is the host side of every sandbox's outbound traffic.
// nftables redirects each TCP connection and DNS query a sandbox makes to
// this package's proxy and resolver (no client configuration inside the
// sandbox). The proxy reads the original destination, the HTTP Host or the
// TLS SNI, applies the sandbox's allowOut/denyOut policy, and dials the
// destination itself, directly or through the sandbox's upstream proxy.
// For domains with header rules it terminates TLS with the sandbox's own CA
// and injects the headers, so secrets never enter the sandbox. Every
// connection and request is recorded in the audit log with its verdict.
package egress

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/destpolicy"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/network"
)

// Recorder receives audit events; *audit.Log is one.
type Recorder interface {
	Record(ctx context.Context, e audit.Event)
}

// Config configures the egress Server.
type Config struct {
	// Gateway is the bridge address the proxy and resolver listen on.
	Gateway netip.Addr
	// Subnet holds every sandbox address; never a destination.
	Subnet netip.Prefix
	// OperatorAllow opens private ranges, as network.Config does.
	OperatorAllow []netip.Prefix
	// Nameservers are the upstream resolvers (IPv4, port 53).
	Nameservers []string
	// RootCAs verify upstream servers when the proxy terminates TLS; nil
	// means the host's roots.
	RootCAs *x509.CertPool
	// CASecret seeds the per-sandbox CAs.
	CASecret []byte
	// Audit records every decision; nil records nothing.
	Audit Recorder
	// DialTimeout bounds connecting upstream. Default 10 s.
	DialTimeout time.Duration
	// PeekTimeout bounds the wait for a client's first bytes (TLS
	// ClientHello, HTTP request line) on ports 80 and 443. Default 10 s.
	PeekTimeout time.Duration
	// Limits bound each sandbox's connections, queries and audit records.
	Limits Limits
}

// Server is the egress proxy and DNS resolver.
type Server struct {
	cfg Config
	log *slog.Logger

	// sockets are the proxy's listener and the resolver's TCP and UDP
	// sockets, each opened again when it dies (supervise.go).
	sockets [3]*supervisor
	nflog   *netlink.Conn

	plainHTTP *connServer // port-80 connections, one request at a time
	mitmHTTP  *connServer // terminated TLS for domains with header rules

	resolver *net.Resolver
	nsNext   atomic.Uint32

	auditQ       chan audit.Event
	auditDropped atomic.Uint64
	nflogDropped atomic.Bool // the kernel dropped logged packets this window

	stop chan struct{}

	mu    sync.RWMutex
	byIP  map[netip.Addr]*binding
	byID  map[string]*binding
	local localAddrs
	obs   Observer // SetObserver; nil: none
	wg    sync.WaitGroup
}

// binding is what the proxy knows of one sandbox.
type binding struct {
	id     string
	ip     netip.Addr
	policy network.Policy
	q      *quota
	// direct and named carry the sandbox's proxied HTTP requests; one
	// pair per sandbox so pooled connections (and the upstream proxy they
	// went through) are never shared with another sandbox. direct's
	// connections are keyed by the address dialled; named's by a name the
	// proxy resolved itself, the only ones that may carry credentials.
	direct, named *http.Transport

	caOnce sync.Once
	ca     *authority
	caErr  error
}

// New returns a Server; Start opens its listeners.
func New(cfg Config, log *slog.Logger) *Server {
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	if cfg.PeekTimeout == 0 {
		cfg.PeekTimeout = 10 * time.Second
	}
	if log == nil {
		log = slog.Default()
	}
	cfg.Limits.setDefaults()
	s := &Server{cfg: cfg, log: log.With("component", "egress"), byIP: map[netip.Addr]*binding{}, byID: map[string]*binding{},
		auditQ: make(chan audit.Event, 8192), stop: make(chan struct{}),
		sockets: [3]*supervisor{newSupervisor(), newSupervisor(), newSupervisor()}}
	s.resolver = &net.Resolver{PreferGo: true, Dial: s.dialNameserver}
	go s.auditWriter()
	go func() {
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				s.flushAll()
			case <-s.stop:
				return
			}
		}
	}()
	return s
}

// freebind lets the listeners bind the gateway address before the bridge
// has it (Setup comes after: it needs the ports).
func freebind(network, address string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_FREEBIND, 1)
	})
	return errors.Join(err, serr)
}

// Start listens on the gateway address and serves until Close. It returns
// the ports for network.Manager.SetEgress.
func (s *Server) Start(ctx context.Context) (network.EgressPorts, error) {
	lc := net.ListenConfig{Control: freebind}
	lc.SetMultipathTCP(false)
	gw := s.cfg.Gateway.String()
	ln, err := lc.Listen(ctx, "tcp4", net.JoinHostPort(gw, "0"))
	if err != nil {
		return network.EgressPorts{}, fmt.Errorf("egress proxy listen: %w", err)
	}
	// The resolver needs one port for both UDP and TCP.
	var tl net.Listener
	var ul net.PacketConn
	for range 20 {
		if tl, err = lc.Listen(ctx, "tcp4", net.JoinHostPort(gw, "0")); err != nil {
			break
		}
		port := tl.Addr().(*net.TCPAddr).Port
		if ul, err = lc.ListenPacket(ctx, "udp4", fmt.Sprintf("%s:%d", gw, port)); err == nil {
			break
		}
		tl.Close()
		tl = nil
	}
	if tl == nil || ul == nil {
		ln.Close()
		return network.EgressPorts{}, fmt.Errorf("egress resolver listen: %w", err)
	}
	var group uint16
	if c, g, err := openNFLog(gw + "/" + s.cfg.Subnet.String()); err != nil {
		s.log.Warn("no audit of traffic refused in the kernel or of UDP flows", "err", err)
	} else {
		s.nflog, group = c, g
		s.wg.Add(1)
		go func() { defer s.wg.Done(); s.watchNFLog(c) }()
	}
	s.plainHTTP = newConnServer(s.serveHTTP)
	s.mitmHTTP = newConnServer(s.serveHTTP)
	s.superviseAll(ctx, lc, ln, tl, ul) // supervise.go
	ports := network.EgressPorts{Proxy: uint16(ln.Addr().(*net.TCPAddr).Port), DNS: uint16(tl.Addr().(*net.TCPAddr).Port), LogGroup: group}
	s.log.Info("egress proxy listening", "addr", gw, "proxy", ports.Proxy, "dns", ports.DNS, "nflogGroup", group, "nameservers", s.cfg.Nameservers)
	return ports, nil
}

// Close stops the listeners. Connections in flight finish on their own.
func (s *Server) Close() error {
	if s == nil {
		return nil
	}
	errs := []error{s.closeSockets()}
	if s.nflog != nil {
		s.nflog.Close()
	}
	s.plainHTTP.close()
	s.mitmHTTP.close()
	s.wg.Wait()
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	return errors.Join(errs...)
}

func (s *Server) acceptLoop(ln net.Listener, handle func(net.Conn)) {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			s.log.Warn("egress accept", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		go handle(c)
	}
}

// Bind implements network.Egress: from now on connections from ip follow p.
func (s *Server) Bind(id string, ip netip.Addr, p network.Policy) error {
	if p.Upstream != nil {
		switch p.Upstream.Scheme {
		case "socks5", "http":
		default:
			return fmt.Errorf("egressProxy: scheme %q is not socks5 or http: %w", p.Upstream.Scheme, errdefs.ErrInvalidArgument)
		}
	}
	b := &binding{id: id, ip: ip, policy: p}
	b.direct, b.named = s.newTransports(b)
	s.mu.Lock()
	old := s.byID[id]
	b.q = newQuota(s.cfg.Limits)
	if old != nil {
		b.q = old.q
		// Keep the CA: the sandbox already trusts it.
		b.ca, b.caErr = old.ca, old.caErr
		if old.ca != nil || old.caErr != nil {
			b.caOnce.Do(func() {})
		}
		delete(s.byIP, old.ip)
	}
	s.byIP[ip] = b
	s.byID[id] = b
	s.mu.Unlock()
	if old != nil {
		old.closeIdle()
	}
	return nil
}

// Unbind implements network.Egress.
func (s *Server) Unbind(id string) {
	s.mu.Lock()
	b := s.byID[id]
	if b != nil {
		delete(s.byID, id)
		if s.byIP[b.ip] == b {
			delete(s.byIP, b.ip)
		}
	}
	s.mu.Unlock()
	if b != nil {
		b.closeIdle()
		s.flushSuppressed(b.q, audit.Event{SandboxID: b.id, TeamID: b.policy.TeamID, APIKeyID: b.policy.APIKeyID})
	}
}

func (b *binding) closeIdle() {
	b.direct.CloseIdleConnections()
	b.named.CloseIdleConnections()
}

func (s *Server) lookup(ip netip.Addr) *binding {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.byIP[ip]
}

// CACertPEM returns the PEM certificate of sandbox id's CA, which the
// sandbox must trust for header rules on HTTPS.
func (s *Server) CACertPEM(id string) ([]byte, error) {
	s.mu.RLock()
	b := s.byID[id]
	s.mu.RUnlock()
	if b == nil {
		return nil, fmt.Errorf("sandbox %s is not bound to the egress proxy: %w", id, errdefs.ErrNotFound)
	}
	a, err := s.authority(b)
	if err != nil {
		return nil, err
	}
	return a.pem, nil
}

func (s *Server) authority(b *binding) (*authority, error) {
	b.caOnce.Do(func() { b.ca, b.caErr = newAuthority(s.cfg.CASecret, b.id) })
	return b.ca, b.caErr
}

func (s *Server) newTransports(b *binding) (direct, named *http.Transport) {
	base := func(dial func(ctx context.Context, network, addr string) (net.Conn, error)) *http.Transport {
		return &http.Transport{
			Proxy:       nil,
			DialContext: dial,
			// Upstream certificates are verified against the host's roots
			// (or RootCAs); nothing turns verification off.
			TLSClientConfig:     &tls.Config{RootCAs: s.cfg.RootCAs, MinVersion: tls.VersionTLS12},
			MaxIdleConnsPerHost: 16,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
			ForceAttemptHTTP2:   false,
		}
	}
	direct = base(func(ctx context.Context, _, addr string) (net.Conn, error) {
		a, err := netip.ParseAddrPort(addr)
		if err != nil {
			return nil, fmt.Errorf("egress: direct dial of %q, not an address", addr)
		}
		return s.dial(ctx, b, a)
	})
	named = base(func(ctx context.Context, _, addr string) (net.Conn, error) {
		host, p, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		// The address serveHTTP resolved for this very name, or a fresh
		// resolution: never one the sandbox chose.
		if t, ok := ctx.Value(targetKey{}).(*target); ok && t.name == host {
			return s.dial(ctx, b, t.addr)
		}
		port, _ := strconv.Atoi(p)
		t, v, err := s.ruleTarget(ctx, b, host, uint16(port))
		if err != nil {
			return nil, err
		}
		if !v.Allow {
			return nil, fmt.Errorf("%s is not allowed for this sandbox: %s", host, v.Rule)
		}
		return s.dial(ctx, b, t)
	})
	return direct, named
}

// ruleTarget resolves name and picks the address to send its credentials
// to, with the policy's verdict on it. A name with any address the
// platform closes (private, host, metadata) is refused outright: its
// credentials must not go near those networks.
func (s *Server) ruleTarget(ctx context.Context, b *binding, name string, port uint16) (netip.AddrPort, network.Verdict, error) {
	addrs, err := s.resolve(ctx, name)
	if err != nil {
		return netip.AddrPort{}, network.Verdict{}, err
	}
	for _, a := range addrs {
		if why := s.platformDenied(a); why != "" {
			return netip.AddrPort{}, network.Verdict{}, fmt.Errorf("%s resolves to %s (%s); refused", name, a, why)
		}
	}
	if len(addrs) == 0 {
		return netip.AddrPort{}, network.Verdict{}, fmt.Errorf("%s has no IPv4 address", name)
	}
	v, _ := b.policy.DecideName(name, addrs[0])
	return netip.AddrPortFrom(addrs[0], port), v, nil
}

// platformDenied says why dst is never reachable from a sandbox, or "".
func (s *Server) platformDenied(dst netip.Addr) string {
	dst = dst.Unmap()
	for _, p := range s.cfg.OperatorAllow {
		if p.Contains(dst) {
			return ""
		}
	}
	switch {
	case !dst.Is4():
		return "platform: not an IPv4 destination"
	case s.cfg.Subnet.Contains(dst):
		return "platform: other sandboxes and the host are unreachable"
	}
	switch destpolicy.Classify(dst) {
	case destpolicy.Loopback, destpolicy.Unspecified:
		return "platform: loopback"
	case destpolicy.LinkLocal:
		return "platform: link-local and metadata addresses are unreachable"
	case destpolicy.Multicast, destpolicy.Broadcast:
		return "platform: multicast and broadcast"
	case destpolicy.Reserved:
		return "platform: reserved addresses are unreachable"
	case destpolicy.Private, destpolicy.Shared:
		return "platform: private networks are unreachable"
	}
	if s.local.has(dst) {
		return "platform: the host is unreachable"
	}
	return ""
}

// localAddrs caches the host's own addresses: a sandbox must not reach a
// host service through the proxy on any of them.
type localAddrs struct {
	mu    sync.Mutex
	at    time.Time
	addrs map[netip.Addr]bool
}

func (l *localAddrs) has(a netip.Addr) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if time.Since(l.at) > 5*time.Second || l.addrs == nil {
		l.addrs = map[netip.Addr]bool{}
		if as, err := net.InterfaceAddrs(); err == nil {
			for _, x := range as {
				if p, err := netip.ParsePrefix(x.String()); err == nil {
					l.addrs[p.Addr().Unmap()] = true
				}
			}
		}
		l.at = time.Now()
	}
	return l.addrs[a]
}

// SetAudit sets where decisions are recorded. Call it before sandboxes are
// bound (before the sandbox manager re-adopts or creates any).
func (s *Server) SetAudit(r Recorder) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cfg.Audit = r
}
