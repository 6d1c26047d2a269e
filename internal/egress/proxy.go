package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/audit"
)

// connEvent accumulates one audit record.
type connEvent struct {
	start    time.Time
	b        *binding
	dst      netip.AddrPort
	name     string // SNI or Host
	proto    string // "tcp", "tls", "http"
	allow    bool
	rule     string
	upstream string // address dialled, when not dst
	sent     int64  // sandbox → destination
	received int64  // destination → sandbox
	err      string
}

func (s *Server) record(ctx context.Context, e *connEvent, action string, extra map[string]any) {
	s.observe(e)
	if s.cfg.Audit == nil {
		return
	}
	fields := map[string]any{
		"dst": e.dst.String(), "proto": e.proto, "bytesOut": e.sent, "bytesIn": e.received,
		"durationMs": time.Since(e.start).Milliseconds(),
	}
	if e.name != "" {
		fields["host"] = e.name
	}
	if e.upstream != "" {
		fields["via"] = e.upstream
	}
	if e.err != "" {
		fields["error"] = e.err
	}
	for k, v := range extra {
		fields[k] = v
	}
	decision := audit.Denied
	if e.allow {
		decision = audit.Allowed
	}
	s.emit(e.b, audit.Event{
		Time: e.start, SandboxID: e.b.id, TeamID: e.b.policy.TeamID, APIKeyID: e.b.policy.APIKeyID,
		Kind: audit.KindEgress, Action: action, Decision: decision, Reason: e.rule, Fields: fields,
	})
}

// emit queues ev of sandbox b for the audit log, within b's audit rate.
func (s *Server) emit(b *binding, ev audit.Event) {
	if s.admit(b.q, ev) && !s.push(ev) {
		// The writer is behind: the record is counted in its
		// destination's row of the window rather than lost.
		b.q.audit.hold(ev)
	}
}

// push hands an event to the audit writer without waiting for the
// database: the record of a request must not delay its response. When the
// writer falls behind by more than the queue, push reports false and the
// caller counts the event in its window's rows rather than stall sandbox
// traffic.
func (s *Server) push(ev audit.Event) bool {
	select {
	case s.auditQ <- ev:
		return true
	default:
		if n := s.auditDropped.Add(1); n&(n-1) == 0 {
			s.log.Warn("egress audit queue full; events counted in suppressed rows instead", "count", n)
		}
		return false
	}
}

func (s *Server) auditWriter() {
	for ev := range s.auditQ {
		s.mu.RLock()
		rec := s.cfg.Audit
		s.mu.RUnlock()
		if rec != nil {
			rec.Record(context.Background(), ev)
		}
	}
}

// originalDst reads where the sandbox meant to connect before nftables
// redirected the connection here.
func originalDst(c *net.TCPConn) (netip.AddrPort, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var out netip.AddrPort
	var serr error
	err = raw.Control(func(fd uintptr) {
		// SO_ORIGINAL_DST fills a sockaddr_in; GetsockoptIPv6Mreq reads 20
		// bytes, enough for it.
		m, err := unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
		if err != nil {
			serr = err
			return
		}
		port := binary.BigEndian.Uint16(m.Multiaddr[2:4])
		ip := netip.AddrFrom4([4]byte(m.Multiaddr[4:8]))
		out = netip.AddrPortFrom(ip, port)
	})
	if err == nil {
		err = serr
	}
	return out, err
}

// reset closes c with a TCP RST: the sandbox sees the refusal at once.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
}

func (s *Server) handle(nc net.Conn) {
	c := nc.(*net.TCPConn)
	ctx := context.Background()
	src, _ := netip.ParseAddrPort(c.RemoteAddr().String())
	b := s.lookup(src.Addr().Unmap())
	if b == nil {
		reset(c)
		return
	}
	dst, err := originalDst(c)
	if err != nil || dst.Addr() == s.cfg.Gateway {
		// Not a redirected connection (nftables only lets those in).
		reset(c)
		return
	}
	e := &connEvent{start: time.Now(), b: b, dst: dst, proto: "tcp"}
	if !acquire(&b.q.conns, s.cfg.Limits.Conns) {
		e.rule = fmt.Sprintf("limit: %d concurrent connections per sandbox", s.cfg.Limits.Conns)
		reset(c)
		s.record(ctx, e, "connect", nil)
		return
	}
	defer b.q.conns.Add(-1)
	if why := s.platformDenied(dst.Addr()); why != "" {
		e.rule = why
		reset(c)
		s.record(ctx, e, "connect", nil)
		return
	}
	switch dst.Port() {
	case 80:
		s.handlePort80(ctx, c, e)
	case 443:
		s.handlePort443(ctx, c, e)
	default:
		v := b.policy.DecideIP(dst.Addr())
		e.allow, e.rule = v.Allow, v.Rule
		if !v.Allow {
			reset(c)
			s.record(ctx, e, "connect", nil)
			return
		}
		s.splice(ctx, c, nil, e, dst)
	}
}

// splice connects to addr and copies both ways; head is what was already
// read from the sandbox.
func (s *Server) splice(ctx context.Context, c *net.TCPConn, head []byte, e *connEvent, addr netip.AddrPort) {
	up, err := s.dial(ctx, e.b, addr)
	if err != nil {
		e.err = err.Error()
		reset(c)
		s.record(ctx, e, "connect", nil)
		return
	}
	if addr != e.dst {
		e.upstream = addr.String()
	}
	if len(head) > 0 {
		n, err := up.Write(head)
		e.sent += int64(n)
		if err != nil {
			up.Close()
			reset(c)
			e.err = err.Error()
			s.record(ctx, e, "connect", nil)
			return
		}
	}
	done := make(chan int64, 1)
	go func() {
		// *net.TCPConn to *net.TCPConn: io.Copy splices in the kernel.
		n, _ := io.Copy(up, c)
		closeWrite(up)
		done <- n
	}()
	n, _ := io.Copy(c, up)
	closeWrite(c)
	e.received += n
	e.sent += <-done
	up.Close()
	c.Close()
	s.record(ctx, e, "connect", nil)
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	c.Close()
}

// replayConn serves bytes already read before the rest of the connection.
type replayConn struct {
	*net.TCPConn
	r io.Reader
}

func (r *replayConn) Read(p []byte) (int, error) { return r.r.Read(p) }

// sniffer is a read-only conn for reading a ClientHello with crypto/tls;
// every byte read is kept for the replay.
type sniffer struct {
	net.Conn
	r io.Reader
}

func (s sniffer) Read(p []byte) (int, error)  { return s.r.Read(p) }
func (s sniffer) Write(p []byte) (int, error) { return 0, io.ErrClosedPipe }

var errSniffed = errors.New("client hello read")

// clientHello reads the TLS ClientHello from c and returns the server name
// and the bytes consumed. ok is false when c does not speak TLS.
func clientHello(c net.Conn, timeout time.Duration) (sni string, head []byte, ok bool) {
	var buf bytes.Buffer
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	defer c.SetReadDeadline(time.Time{})
	seen := false
	err := tls.Server(sniffer{Conn: c, r: io.TeeReader(c, &buf)}, &tls.Config{
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			sni, seen = h.ServerName, true
			return nil, errSniffed
		},
	}).Handshake()
	_ = err
	return strings.ToLower(sni), buf.Bytes(), seen
}

func (s *Server) handlePort443(ctx context.Context, c *net.TCPConn, e *connEvent) {
	sni, head, isTLS := clientHello(c, s.cfg.PeekTimeout)
	pol := e.b.policy
	if !isTLS {
		v := pol.DecideIP(e.dst.Addr())
		e.allow, e.rule = v.Allow, v.Rule
		if !v.Allow {
			reset(c)
			s.record(ctx, e, "connect", nil)
			return
		}
		s.splice(ctx, c, head, e, e.dst)
		return
	}
	sni = canonicalName(sni)
	e.proto, e.name = "tls", sni
	if sni != "" && len(pol.RulesFor(sni)) > 0 {
		// Credentials for sni: the proxy ends this TLS session and sends
		// each request to where sni resolves, whatever address the
		// sandbox dialled.
		t, v, err := s.ruleTarget(ctx, e.b, sni, e.dst.Port())
		if err != nil {
			e.err = err.Error()
		} else {
			e.allow, e.rule, e.upstream = v.Allow, v.Rule, t.String()
		}
		if !e.allow {
			refuseTLS(c)
			s.record(ctx, e, "connect", nil)
			return
		}
		s.terminate(ctx, c, head, e)
		return
	}
	v, byName := pol.DecideName(sni, e.dst.Addr())
	e.allow, e.rule = v.Allow, v.Rule
	if !v.Allow {
		refuseTLS(c)
		s.record(ctx, e, "connect", nil)
		return
	}
	target, err := s.target(ctx, e, byName)
	if err != nil {
		e.allow, e.err = false, err.Error()
		refuseTLS(c)
		s.record(ctx, e, "connect", nil)
		return
	}
	// No rules for this name: the TLS session passes through untouched.
	s.splice(ctx, c, head, e, target)
}

// refuseTLS answers a ClientHello with a fatal access_denied alert and
// closes: the client reports a refusal, not a network error.
func refuseTLS(c *net.TCPConn) {
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = c.Write([]byte{21, 3, 3, 0, 2, 2, 49}) // alert record: fatal, access_denied
	_ = c.CloseWrite()
	c.Close()
}

// target picks the address to dial for an allowed connection. When only the
// name allowed it, the proxy connects where the name resolves, never to an
// address the sandbox chose, so a forged SNI or Host cannot open another
// destination.
func (s *Server) target(ctx context.Context, e *connEvent, byName bool) (netip.AddrPort, error) {
	if !byName {
		return e.dst, nil
	}
	addrs, err := s.resolve(ctx, e.name)
	if err != nil {
		return netip.AddrPort{}, err
	}
	var pick netip.Addr
	for _, a := range addrs {
		if s.platformDenied(a) != "" {
			continue
		}
		if a == e.dst.Addr() {
			pick = a
			break
		}
		if !pick.IsValid() {
			pick = a
		}
	}
	if !pick.IsValid() {
		return netip.AddrPort{}, fmt.Errorf("%s resolves to no reachable public address", e.name)
	}
	return netip.AddrPortFrom(pick, e.dst.Port()), nil
}

func (s *Server) resolve(ctx context.Context, name string) ([]netip.Addr, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	addrs, err := s.resolver.LookupNetIP(ctx, "ip4", name)
	if err != nil {
		return nil, fmt.Errorf("resolve %s: %w", name, err)
	}
	return addrs, nil
}

// terminate ends the sandbox's TLS session with a certificate from its own
// CA and serves the requests inside it, with the header rules applied.
func (s *Server) terminate(ctx context.Context, c *net.TCPConn, head []byte, e *connEvent) {
	a, err := s.authority(e.b)
	if err != nil {
		e.allow, e.err = false, err.Error()
		reset(c)
		s.record(ctx, e, "connect", nil)
		return
	}
	rc := &replayConn{TCPConn: c, r: io.MultiReader(bytes.NewReader(head), c)}
	tc := tls.Server(rc, &tls.Config{
		GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) { return a.leaf(e.name) },
		NextProtos:     []string{"http/1.1"},
	})
	s.mitmHTTP.serve(tc, &connInfo{b: e.b, dst: e.dst, sni: e.name, tls: true, start: e.start})
}

// handlePort80 serves plain HTTP request by request, so every request's
// Host is checked, not only the first one's.
func (s *Server) handlePort80(ctx context.Context, c *net.TCPConn, e *connEvent) {
	br := bufio.NewReaderSize(c, 4096)
	_ = c.SetReadDeadline(time.Now().Add(s.cfg.PeekTimeout))
	first, _ := br.Peek(8)
	_ = c.SetReadDeadline(time.Time{})
	if !looksLikeHTTP(first) {
		v := e.b.policy.DecideIP(e.dst.Addr())
		e.allow, e.rule = v.Allow, v.Rule
		if !v.Allow {
			reset(c)
			s.record(ctx, e, "connect", nil)
			return
		}
		head, _ := br.Peek(br.Buffered())
		s.splice(ctx, c, bytes.Clone(head), e, e.dst)
		return
	}
	rc := &replayConn{TCPConn: c, r: br}
	s.plainHTTP.serve(rc, &connInfo{b: e.b, dst: e.dst, start: e.start})
}

func looksLikeHTTP(b []byte) bool {
	i := bytes.IndexByte(b, ' ')
	if i < 3 {
		return false
	}
	for _, ch := range b[:i] {
		if ch < 'A' || ch > 'Z' {
			return false
		}
	}
	return true
}
