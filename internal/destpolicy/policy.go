package destpolicy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// AllowFlag is the serve flag that opens a destination; refusals name it.
const AllowFlag = "--fetch-allow"

// Resolver looks names up; *net.Resolver is one.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Config configures a Policy. The zero value refuses every closed class,
// the host's own addresses, and nothing more.
type Config struct {
	// Allow opens destinations the rules close: an operator's registry on
	// a private network or on this host. Deny still wins.
	Allow []Allowed
	// Deny closes ranges that may look public: the sandbox subnets, a
	// cluster's pod and service CIDRs.
	Deny []netip.Prefix
	// Resolver resolves names; nil: net.DefaultResolver.
	Resolver Resolver
	// HostAddrs lists the host's own addresses, read at each connect so an
	// address added after start is closed too; nil: every interface's.
	HostAddrs func() ([]netip.Addr, error)
	// DialTimeout bounds one connect. Default 10 s.
	DialTimeout time.Duration
	// MaxRedirects bounds the redirects one request follows. Default 5.
	MaxRedirects int
}

// Allowed is one destination an operator opened: a host name, an address or
// a CIDR (Prefix), on one port or, with Port 0, on every port.
type Allowed struct {
	Host   string
	Prefix netip.Prefix
	Port   uint16
}

// ParseAllowed parses host[:port], IP[:port] ([v6]:port) or CIDR.
func ParseAllowed(s string) (Allowed, error) {
	s = strings.TrimSpace(s)
	bad := func(why string) (Allowed, error) {
		return Allowed{}, fmt.Errorf("%s %q: %s; want host[:port], IP[:port] or CIDR, e.g. registry.lan:5000, 10.0.0.5:5000 or 10.0.0.0/24: %w", AllowFlag, s, why, errdefs.ErrInvalidArgument)
	}
	if s == "" {
		return bad("empty")
	}
	if p, err := netip.ParsePrefix(s); err == nil {
		if p.Bits() == 0 {
			return bad("would open every address")
		}
		return Allowed{Prefix: p.Masked()}, nil
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return Allowed{Prefix: netip.PrefixFrom(a, a.BitLen())}, nil
	}
	host, port := s, uint16(0)
	if h, p, err := net.SplitHostPort(s); err == nil {
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil || n == 0 {
			return bad("bad port")
		}
		host, port = h, uint16(n)
	}
	if a, err := netip.ParseAddr(host); err == nil {
		return Allowed{Prefix: netip.PrefixFrom(a, a.BitLen()), Port: port}, nil
	}
	host = canonicalName(host)
	if host == "" || strings.ContainsAny(host, "/[]@ ") {
		return bad("not a host name")
	}
	if _, ok := parseLegacyIPv4(host); ok {
		return bad("write the address as a.b.c.d")
	}
	return Allowed{Host: host, Port: port}, nil
}

func (a Allowed) String() string {
	h := a.Host
	if h == "" {
		if a.Prefix.IsSingleIP() {
			h = a.Prefix.Addr().String()
		} else {
			return a.Prefix.String()
		}
	}
	if a.Port == 0 {
		return h
	}
	return net.JoinHostPort(h, strconv.Itoa(int(a.Port)))
}

func (a Allowed) match(host string, addr netip.Addr, port uint16) bool {
	if a.Port != 0 && a.Port != port {
		return false
	}
	if a.Host != "" {
		return a.Host == host
	}
	return a.Prefix.Contains(addr)
}

func canonicalName(h string) string { return strings.ToLower(strings.TrimSuffix(h, ".")) }

// RefusedError is a destination the policy closes. Its message is for the
// tenant: it names the destination as the tenant wrote it and the class it
// falls in, never the address a name resolved to (Addr, for the server's
// log). It wraps errdefs.ErrInvalidArgument.
type RefusedError struct {
	Dest string     // host:port as named
	Addr netip.Addr // the address refused
	Why  string     // e.g. "a loopback address"
	// Named is set when Dest is a name that resolved to Addr.
	Named bool
}

func (e *RefusedError) Error() string {
	verb := "is"
	if e.Named {
		verb = "resolves to"
	}
	return fmt.Sprintf("%s %s %s, which server-side fetches may not reach; an operator can allow it with %s", e.Dest, verb, e.Why, AllowFlag)
}

func (e *RefusedError) Unwrap() error { return errdefs.ErrInvalidArgument }

// ErrTooManyRedirects is a request that redirected more than MaxRedirects
// times.
var ErrTooManyRedirects = errors.New("too many redirects")

// Policy decides and dials server-side fetches for tenants. It is safe for
// concurrent use.
type Policy struct {
	cfg Config
}

// New returns a Policy.
func New(cfg Config) *Policy {
	if cfg.Resolver == nil {
		cfg.Resolver = net.DefaultResolver
	}
	if cfg.HostAddrs == nil {
		cfg.HostAddrs = interfaceAddrs
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	if cfg.MaxRedirects == 0 {
		cfg.MaxRedirects = 5
	}
	return &Policy{cfg: cfg}
}

func interfaceAddrs() ([]netip.Addr, error) {
	as, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	out := make([]netip.Addr, 0, len(as))
	for _, x := range as {
		if p, err := netip.ParsePrefix(x.String()); err == nil {
			out = append(out, p.Addr().Unmap())
		}
	}
	return out, nil
}

// Check decides whether the server may connect to addr on port for dest
// (host:port as named; host is the name, or the address itself). It
// returns nil or a *RefusedError.
func (p *Policy) Check(dest, host string, addr netip.Addr, port uint16) error {
	addr = addr.Unmap().WithZone("")
	host = canonicalName(host)
	_, lit := parseAddr(host)
	refuse := func(why string) error {
		return &RefusedError{Dest: dest, Addr: addr, Why: why, Named: !lit}
	}
	for _, d := range p.cfg.Deny {
		if d.Contains(addr) {
			return refuse("an address of the sandbox or cluster network")
		}
	}
	for _, a := range p.cfg.Allow {
		if a.match(host, addr, port) {
			return nil
		}
	}
	if c := Classify(addr); c != Public {
		return refuse(c.String())
	}
	own, err := p.cfg.HostAddrs()
	if err != nil {
		return refuse("not known to be outside this host (its addresses could not be read: " + err.Error() + ")")
	}
	for _, o := range own {
		if o.Unmap().WithZone("") == addr {
			return refuse("an address of this host")
		}
	}
	return nil
}

// parseAddr parses a literal IP address, bracketed or not.
func parseAddr(host string) (netip.Addr, bool) {
	a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"))
	return a, err == nil
}

// DialContext connects to address ("host:port") over TCP if the policy
// allows every address the host resolves to. The address actually
// connected is checked again as the socket connects (net.Dialer.Control),
// so what is checked is what is reached.
func (p *Policy) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	switch network {
	case "tcp", "tcp4", "tcp6":
	default:
		return nil, fmt.Errorf("server-side fetch over %s: only TCP: %w", network, errdefs.ErrInvalidArgument)
	}
	host, portStr, err := net.SplitHostPort(address)
	if err != nil {
		return nil, fmt.Errorf("fetch %s: %w", address, err)
	}
	n, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("fetch %s: port %q: %w", address, portStr, errdefs.ErrInvalidArgument)
	}
	port := uint16(n)
	var addrs []netip.Addr
	if a, ok := parseAddr(host); ok {
		addrs = []netip.Addr{a}
	} else {
		if a, ok := parseLegacyIPv4(host); ok {
			// A C resolver would read it as a; the policy refuses the form.
			return nil, &RefusedError{Dest: address, Addr: a, Why: "an IP address in a non-canonical form (write it as a.b.c.d)"}
		}
		if addrs, err = p.cfg.Resolver.LookupNetIP(ctx, "ip", host); err != nil {
			return nil, fmt.Errorf("resolve %s: %w", host, err)
		}
		if len(addrs) == 0 {
			return nil, fmt.Errorf("resolve %s: no address", host)
		}
	}
	// A name with any closed address is refused whole: which one a client
	// connects to first is not the tenant's to pick.
	for _, a := range addrs {
		if err := p.Check(address, host, a, port); err != nil {
			return nil, err
		}
	}
	var errs []error
	for _, a := range addrs {
		var refused error
		d := net.Dialer{Timeout: p.cfg.DialTimeout, Control: func(_, raddr string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(raddr)
			if err != nil {
				refused = fmt.Errorf("connect to %q: %w", raddr, err)
			} else {
				refused = p.Check(address, host, ap.Addr(), ap.Port())
			}
			return refused
		}}
		d.SetMultipathTCP(false)
		c, err := d.DialContext(ctx, network, netip.AddrPortFrom(a, port).String())
		if err == nil {
			return c, nil
		}
		if refused != nil {
			return nil, refused
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

// Transport returns a new HTTP transport whose every connection, redirects
// and proxy settings included, goes through the policy: it dials with
// DialContext, ignores HTTP_PROXY and the like (a proxy would connect
// where the policy cannot see), and refuses a request past MaxRedirects
// redirects whatever client drives it.
func (p *Policy) Transport() http.RoundTripper {
	t := &http.Transport{
		Proxy:                 nil,
		DialContext:           p.DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          16,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   15 * time.Second,
		ResponseHeaderTimeout: 60 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
	return &redirectCap{rt: t, max: p.cfg.MaxRedirects}
}

// Client returns an HTTP client over Transport that follows at most
// MaxRedirects redirects, each one dialled through the policy.
func (p *Policy) Client(timeout time.Duration) *http.Client {
	return &http.Client{Transport: p.Transport(), Timeout: timeout, CheckRedirect: func(req *http.Request, via []*http.Request) error {
		if len(via) > p.cfg.MaxRedirects {
			return fmt.Errorf("%s: more than %d redirects: %w", via[0].URL.Redacted(), p.cfg.MaxRedirects, ErrTooManyRedirects)
		}
		return nil
	}}
}

// redirectCap counts the redirects that led to a request (net/http links
// each redirected request to the response that caused it).
type redirectCap struct {
	rt  http.RoundTripper
	max int
}

func (r *redirectCap) RoundTrip(req *http.Request) (*http.Response, error) {
	hops := 0
	for resp := req.Response; resp != nil && resp.Request != nil; resp = resp.Request.Response {
		hops++
	}
	if hops > r.max {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, fmt.Errorf("more than %d redirects: %w", r.max, ErrTooManyRedirects)
	}
	return r.rt.RoundTrip(req)
}

// CloseIdleConnections lets http.Client.CloseIdleConnections reach the
// transport.
func (r *redirectCap) CloseIdleConnections() {
	if c, ok := r.rt.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// parseLegacyIPv4 parses the forms inet_aton accepts and netip does not:
// fewer than four parts ("127.1", "2130706433") and octal or hex parts
// ("0177.0.0.1", "0x7f.0.0.1"). A C resolver reads such a name as an
// address, so the policy must not take it for a name.
func parseLegacyIPv4(s string) (netip.Addr, bool) {
	parts := strings.Split(s, ".")
	if len(parts) > 4 || s == "" {
		return netip.Addr{}, false
	}
	vals := make([]uint64, len(parts))
	for i, p := range parts {
		if p == "" {
			return netip.Addr{}, false
		}
		base := 10
		switch {
		case strings.HasPrefix(p, "0x") || strings.HasPrefix(p, "0X"):
			base, p = 16, p[2:]
			if p == "" {
				p = "0"
			}
		case len(p) > 1 && p[0] == '0':
			base, p = 8, p[1:]
		}
		v, err := strconv.ParseUint(p, base, 32)
		if err != nil {
			return netip.Addr{}, false
		}
		vals[i] = v
	}
	var n uint64
	last := len(vals) - 1
	for i, v := range vals[:last] {
		if v > 0xff {
			return netip.Addr{}, false
		}
		n |= v << (24 - 8*i)
	}
	if vals[last] >= 1<<(8*(4-last)) {
		return netip.Addr{}, false
	}
	n |= vals[last]
	return netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}), true
}
