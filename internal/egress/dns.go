package egress

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/network"
)

// The resolver answers a sandbox only for names it may connect to: names
// in allowOut, or anything when its default is to allow. Every other name
// gets NXDOMAIN at once, without a query upstream: a name is data, and a
// sandbox without internet must not be able to send it anywhere (no DNS
// tunnel through the host's resolvers). A sandbox no name is allowed to
// (internet off, no domain in allowOut) gets REFUSED for every name: deny
// all is deny all, DNS included. An allowOut address range opens
// addresses, not names.

func (s *Server) serveDNSUDP(pc net.PacketConn) {
	buf := make([]byte, 4096)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		src, _ := netip.ParseAddrPort(from.String())
		b := s.lookup(src.Addr().Unmap())
		if b == nil {
			continue
		}
		q := append([]byte(nil), buf[:n]...)
		// Refusals over the sandbox's limits are answered here, without a
		// goroutine: a flood costs this loop, not the server's memory.
		if why := s.dnsLimited(b); why != "" {
			if out := s.refuseQuery(b, q, why); out != nil {
				_, _ = pc.WriteTo(out, from)
			}
			continue
		}
		go func() {
			defer b.q.dnsBusy.Add(-1)
			if out := s.query(context.Background(), b, q, "udp"); out != nil {
				_, _ = pc.WriteTo(out, from)
			}
		}()
	}
}

func (s *Server) serveDNSTCP(c net.Conn) {
	defer c.Close()
	src, _ := netip.ParseAddrPort(c.RemoteAddr().String())
	b := s.lookup(src.Addr().Unmap())
	if b == nil || !acquire(&b.q.conns, s.cfg.Limits.Conns) {
		return
	}
	defer b.q.conns.Add(-1)
	for {
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		var l [2]byte
		if _, err := io.ReadFull(c, l[:]); err != nil {
			return
		}
		q := make([]byte, binary.BigEndian.Uint16(l[:]))
		if _, err := io.ReadFull(c, q); err != nil {
			return
		}
		var out []byte
		if why := s.dnsLimited(b); why != "" {
			out = s.refuseQuery(b, q, why)
		} else {
			out = s.query(context.Background(), b, q, "tcp")
			b.q.dnsBusy.Add(-1)
		}
		if out == nil {
			return
		}
		binary.BigEndian.PutUint16(l[:], uint16(len(out)))
		if _, err := c.Write(append(l[:], out...)); err != nil {
			return
		}
	}
}

// dnsLimited takes one of b's in-flight query slots, or says which limit
// refuses the query.
func (s *Server) dnsLimited(b *binding) string {
	if !b.q.dns.allow() {
		return fmt.Sprintf("limit: %.0f DNS queries per second per sandbox", s.cfg.Limits.DNSRate)
	}
	if !acquire(&b.q.dnsBusy, s.cfg.Limits.DNSInFlight) {
		return fmt.Sprintf("limit: %d DNS queries in flight per sandbox", s.cfg.Limits.DNSInFlight)
	}
	return ""
}

// refuseQuery answers q with REFUSED and records why.
func (s *Server) refuseQuery(b *binding, q []byte, why string) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(q)
	if err != nil {
		return nil
	}
	qs, _ := p.AllQuestions()
	name, typ := "", dnsmessage.Type(0)
	if len(qs) > 0 {
		name, typ = strings.TrimSuffix(strings.ToLower(qs[0].Name.String()), "."), qs[0].Type
	}
	s.recordDNS(context.Background(), b, name, typ, false, why)
	return reply(h, qs, dnsmessage.RCodeRefused)
}

// query answers one DNS message from a sandbox; nil means no answer.
func (s *Server) query(ctx context.Context, b *binding, q []byte, transport string) []byte {
	// The newest policy: b may predate a policy change.
	if cur := s.lookup(b.ip); cur != nil && cur.id == b.id {
		b = cur
	}
	var p dnsmessage.Parser
	h, err := p.Start(q)
	if err != nil {
		return nil
	}
	qs, err := p.AllQuestions()
	if err != nil || len(qs) != 1 {
		return reply(h, qs, dnsmessage.RCodeFormatError)
	}
	name := strings.TrimSuffix(strings.ToLower(qs[0].Name.String()), ".")
	pol := b.policy
	if _, named := pol.AllowsDomain(name); !named && !defaultAllows(pol) {
		if len(pol.AllowDomains) == 0 {
			s.recordDNS(ctx, b, name, qs[0].Type, false, "no name resolves: "+pol.DecideIP(netip.IPv4Unspecified()).Rule+" and no domain in allowOut")
			return reply(h, qs, dnsmessage.RCodeRefused)
		}
		s.recordDNS(ctx, b, name, qs[0].Type, false, "not in allowOut: "+pol.DecideIP(netip.IPv4Unspecified()).Rule)
		return reply(h, qs, dnsmessage.RCodeNameError)
	}
	out, err := s.forward(ctx, q, transport)
	if err != nil {
		s.log.Debug("dns upstream", "name", name, "err", err)
		return reply(h, qs, dnsmessage.RCodeServerFailure)
	}
	return out
}

// defaultAllows reports whether p lets a sandbox reach an arbitrary public
// address.
func defaultAllows(p network.Policy) bool {
	if !p.AllowInternet {
		return false
	}
	for _, d := range p.DenyOut {
		if d.Bits() == 0 {
			return false
		}
	}
	return true
}

func reply(h dnsmessage.Header, qs []dnsmessage.Question, rcode dnsmessage.RCode) []byte {
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, OpCode: h.OpCode,
		RecursionDesired: h.RecursionDesired, RecursionAvailable: true, RCode: rcode})
	_ = b.StartQuestions()
	for _, q := range qs {
		_ = b.Question(q)
	}
	out, err := b.Finish()
	if err != nil {
		return nil
	}
	return out
}

// forward relays q to the upstream nameservers, first answer wins.
func (s *Server) forward(ctx context.Context, q []byte, transport string) ([]byte, error) {
	if len(s.cfg.Nameservers) == 0 {
		return nil, errors.New("no upstream nameserver")
	}
	var errs []error
	for _, ns := range s.cfg.Nameservers {
		out, err := exchange(ctx, transport, net.JoinHostPort(ns, "53"), q)
		if err == nil {
			return out, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

func exchange(ctx context.Context, transport, addr string, q []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, transport, addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	dl, _ := ctx.Deadline()
	_ = c.SetDeadline(dl)
	if transport == "udp" {
		if _, err := c.Write(q); err != nil {
			return nil, err
		}
		buf := make([]byte, 65535)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return nil, err
			}
			// Only the answer to this query (same id) counts.
			if n >= 2 && buf[0] == q[0] && buf[1] == q[1] {
				return buf[:n], nil
			}
		}
	}
	msg := make([]byte, 2+len(q))
	binary.BigEndian.PutUint16(msg, uint16(len(q)))
	copy(msg[2:], q)
	if _, err := c.Write(msg); err != nil {
		return nil, err
	}
	var l [2]byte
	if _, err := io.ReadFull(c, l[:]); err != nil {
		return nil, err
	}
	out := make([]byte, binary.BigEndian.Uint16(l[:]))
	if _, err := io.ReadFull(c, out); err != nil {
		return nil, err
	}
	return out, nil
}

func (s *Server) recordDNS(ctx context.Context, b *binding, name string, t dnsmessage.Type, allow bool, rule string) {
	if s.cfg.Audit == nil {
		return
	}
	decision := audit.Denied
	if allow {
		decision = audit.Allowed
	}
	s.emit(b, audit.Event{
		Time: time.Now(), SandboxID: b.id, TeamID: b.policy.TeamID, APIKeyID: b.policy.APIKeyID,
		Kind: audit.KindEgress, Action: "dns", Decision: decision, Reason: rule,
		Fields: map[string]any{"host": name, "type": fmt.Sprint(t), "dst": "dns"},
	})
}
