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
// in allowOut, anything when its default is to allow, and otherwise names
// whose addresses an allowOut range covers. Everything else gets NXDOMAIN
// at once, so programs fail fast instead of waiting for timeouts.

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
		q := append([]byte(nil), buf[:n]...)
		src, _ := netip.ParseAddrPort(from.String())
		go func() {
			if out := s.query(context.Background(), src.Addr().Unmap(), q, "udp"); out != nil {
				_, _ = pc.WriteTo(out, from)
			}
		}()
	}
}

func (s *Server) serveDNSTCP(c net.Conn) {
	defer c.Close()
	src, _ := netip.ParseAddrPort(c.RemoteAddr().String())
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
		out := s.query(context.Background(), src.Addr().Unmap(), q, "tcp")
		if out == nil {
			return
		}
		binary.BigEndian.PutUint16(l[:], uint16(len(out)))
		if _, err := c.Write(append(l[:], out...)); err != nil {
			return
		}
	}
}

// query answers one DNS message from a sandbox; nil means no answer.
func (s *Server) query(ctx context.Context, src netip.Addr, q []byte, transport string) []byte {
	b := s.lookup(src)
	if b == nil {
		return nil
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
	_, named := pol.AllowsDomain(name)
	// Neither allowed by name nor by default: only an answer whose address
	// allowOut covers may go back.
	filter := !named && !defaultAllows(pol)
	if filter && len(pol.AllowOut) == 0 {
		s.recordDNS(ctx, b, name, qs[0].Type, false, pol.DecideIP(netip.IPv4Unspecified()).Rule)
		return reply(h, qs, dnsmessage.RCodeNameError)
	}
	out, err := s.forward(ctx, q, transport)
	if err != nil {
		s.log.Debug("dns upstream", "name", name, "err", err)
		return reply(h, qs, dnsmessage.RCodeServerFailure)
	}
	if filter && !answerAllowed(pol, out) {
		s.recordDNS(ctx, b, name, qs[0].Type, false, "no address of the name is in allowOut")
		return reply(h, qs, dnsmessage.RCodeNameError)
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

// answerAllowed reports whether an upstream answer holds an address p
// allows.
func answerAllowed(p network.Policy, msg []byte) bool {
	var ps dnsmessage.Parser
	if _, err := ps.Start(msg); err != nil {
		return false
	}
	if err := ps.SkipAllQuestions(); err != nil {
		return false
	}
	for {
		h, err := ps.AnswerHeader()
		if err != nil {
			return false
		}
		if h.Type != dnsmessage.TypeA {
			if err := ps.SkipAnswer(); err != nil {
				return false
			}
			continue
		}
		a, err := ps.AResource()
		if err != nil {
			return false
		}
		if p.DecideIP(netip.AddrFrom4(a.A)).Allow {
			return true
		}
	}
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
	s.enqueue(audit.Event{
		Time: time.Now(), SandboxID: b.id, TeamID: b.policy.TeamID, APIKeyID: b.policy.APIKeyID,
		Kind: audit.KindEgress, Action: "dns", Decision: decision, Reason: rule,
		Fields: map[string]any{"host": name, "type": fmt.Sprint(t), "dst": "dns"},
	})
}
