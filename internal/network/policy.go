package network

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// AllTraffic is E2B's name for every IPv4 destination.
const AllTraffic = "ALL_TRAFFIC"

// HeaderTransform is one rule of a domain: headers added to, or replacing
// those of, every matching request. Values are final (secrets resolved).
//
// The egress proxy adds them only to a request it sends itself to an
// address it resolved for the request's name, over TLS verified against
// the host's roots; over plain HTTP only when AllowPlainHTTP is set.
type HeaderTransform struct {
	Headers map[string]string
	// AllowPlainHTTP lets the headers travel over unencrypted HTTP (port
	// 80) too, readable by every network on the way. Off by default.
	AllowPlainHTTP bool
}

// DomainRules attaches header transforms to a domain pattern.
type DomainRules struct {
	Pattern    string // "api.example.com" or "*.example.com"
	Transforms []HeaderTransform
}

// UpstreamProxy is a proxy all allowed TCP egress is tunnelled through,
// invisible to the sandbox.
type UpstreamProxy struct {
	Scheme   string // "socks5" or "http" (CONNECT)
	Address  string // host:port
	Username string
	Password string
}

// Policy is a sandbox's egress policy. The host, other sandboxes, private
// (RFC 1918, CGNAT), loopback and link-local ranges stay denied whatever it
// says, unless the operator opened a range (Config.OperatorAllow).
//
// Evaluation, as E2B documents it: a destination in AllowOut (or, for
// HTTP/TLS, a name in AllowDomains) is allowed; otherwise one in DenyOut is
// denied; otherwise AllowInternet decides.
type Policy struct {
	AllowInternet bool
	AllowOut      []netip.Prefix
	AllowDomains  []string // lower case, exact or "*." wildcards
	DenyOut       []netip.Prefix
	// Rules inject headers into requests to matching domains; HTTPS to them
	// is terminated with the sandbox's own CA. Rules never allow anything.
	Rules []DomainRules
	// Upstream, when set, carries all allowed TCP egress.
	Upstream *UpstreamProxy
	// TeamID and APIKeyID label audit records.
	TeamID   string
	APIKeyID string
}

// HasIPRules reports whether the policy needs per-sandbox nftables rules.
func (p Policy) HasIPRules() bool { return len(p.AllowOut) > 0 || len(p.DenyOut) > 0 }

// DecidesByName reports whether a domain in p could allow a connection its
// IP rules deny, so the proxy must read the HTTP Host or TLS SNI of
// connections to ports 80 and 443 before deciding.
func (p Policy) DecidesByName() bool { return len(p.AllowDomains) > 0 }

// NeedsProxy reports whether only the egress proxy can enforce p.
func (p Policy) NeedsProxy() bool {
	return len(p.AllowDomains) > 0 || len(p.Rules) > 0 || p.Upstream != nil
}

func invalidf(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, errdefs.ErrInvalidArgument)...)
}

// ParsePrefix reads an IPv4 address, CIDR or ALL_TRAFFIC. field names the
// entry in errors, e.g. "network.denyOut[2]".
func ParsePrefix(field, s string) (netip.Prefix, error) {
	if s == AllTraffic {
		return netip.MustParsePrefix("0.0.0.0/0"), nil
	}
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, invalidf("%s: %q is not a valid CIDR block (e.g. \"198.51.100.0/24\")", field, s)
		}
		if !p.Addr().Is4() {
			return netip.Prefix{}, invalidf("%s: %q is IPv6; sandboxes have IPv4 only", field, s)
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, invalidf("%s: %q is not an IPv4 address or CIDR block", field, s)
	}
	if !a.Is4() {
		return netip.Prefix{}, invalidf("%s: %q is IPv6; sandboxes have IPv4 only", field, s)
	}
	return netip.PrefixFrom(a, 32), nil
}

// LooksLikeAddress tells a mistyped address ("10.0.0.300", "1.2.3.4/40")
// from a domain name so the error says what is wrong.
func LooksLikeAddress(s string) bool {
	return strings.ContainsAny(s, "/:") || strings.Trim(s, "0123456789.") == ""
}

// ParseDomain validates a domain pattern: an exact name or a single leading
// "*." wildcard. It returns the lower-case form without a trailing dot.
func ParseDomain(field, s string) (string, error) {
	d := strings.TrimSuffix(strings.ToLower(strings.TrimSpace(s)), ".")
	name := strings.TrimPrefix(d, "*.")
	if d == "" || d == "*" {
		return "", invalidf("%s: %q is not a domain; use a name like \"example.com\" or \"*.example.com\"", field, s)
	}
	if len(name) > 253 || strings.Contains(name, "*") {
		return "", invalidf("%s: %q is not a valid domain; only one leading \"*.\" wildcard is allowed", field, s)
	}
	for _, label := range strings.Split(name, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return "", invalidf("%s: %q is not a valid domain name", field, s)
		}
		for _, c := range []byte(label) {
			if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' && c != '_' {
				return "", invalidf("%s: %q is not a valid domain name (letters, digits, '-' and punycode only)", field, s)
			}
		}
	}
	return d, nil
}

// ParseAllowOut splits E2B allowOut entries into prefixes and domains.
func ParseAllowOut(field string, entries []string) ([]netip.Prefix, []string, error) {
	var prefixes []netip.Prefix
	var domains []string
	for i, e := range entries {
		f := fmt.Sprintf("%s[%d]", field, i)
		if e == AllTraffic || LooksLikeAddress(e) {
			p, err := ParsePrefix(f, e)
			if err != nil {
				return nil, nil, err
			}
			prefixes = append(prefixes, p)
			continue
		}
		d, err := ParseDomain(f, e)
		if err != nil {
			return nil, nil, err
		}
		if !slices.Contains(domains, d) {
			domains = append(domains, d)
		}
	}
	return prefixes, domains, nil
}

// ParseDenyOut reads E2B denyOut entries: addresses and CIDRs only.
func ParseDenyOut(field string, entries []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for i, e := range entries {
		f := fmt.Sprintf("%s[%d]", field, i)
		if e != AllTraffic && !LooksLikeAddress(e) {
			return nil, invalidf("%s: %q: denyOut takes IPv4 addresses and CIDR blocks only, not domains", f, e)
		}
		p, err := ParsePrefix(f, e)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// MatchDomain reports whether name matches pattern. "*.example.com" matches
// subdomains at any depth, not the apex.
func MatchDomain(pattern, name string) bool {
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	if suffix, ok := strings.CutPrefix(pattern, "*."); ok {
		return strings.HasSuffix(name, "."+suffix)
	}
	return name == pattern
}

// RulesFor returns the transforms of the best rule for name: an exact
// pattern first, then the longest matching wildcard. Rules are not merged.
func (p Policy) RulesFor(name string) []HeaderTransform {
	best := -1
	for i, r := range p.Rules {
		if !MatchDomain(r.Pattern, name) {
			continue
		}
		if !strings.HasPrefix(r.Pattern, "*.") {
			return r.Transforms
		}
		if best < 0 || len(r.Pattern) > len(p.Rules[best].Pattern) {
			best = i
		}
	}
	if best < 0 {
		return nil
	}
	return p.Rules[best].Transforms
}

// InjectFor returns the transforms to apply to a request for name: all of
// the best rule's over TLS, only those that opted in over plain HTTP.
func (p Policy) InjectFor(name string, tls bool) []HeaderTransform {
	ts := p.RulesFor(name)
	if tls {
		return ts
	}
	var out []HeaderTransform
	for _, t := range ts {
		if t.AllowPlainHTTP {
			out = append(out, t)
		}
	}
	return out
}

// AllowsDomain returns the allowOut pattern that matches name, if any.
func (p Policy) AllowsDomain(name string) (string, bool) {
	for _, d := range p.AllowDomains {
		if MatchDomain(d, name) {
			return d, true
		}
	}
	return "", false
}

// Verdict is the outcome of an egress decision and the rule that made it.
type Verdict struct {
	Allow bool
	Rule  string // e.g. "allowOut 198.51.100.0/24", "denyOut ALL_TRAFFIC", "default"
}

// DecideIP applies the IP part of p to dst.
func (p Policy) DecideIP(dst netip.Addr) Verdict {
	if v, ok := p.matchAllowIP(dst); ok {
		return v
	}
	return p.denyOrDefault(dst)
}

func (p Policy) matchAllowIP(dst netip.Addr) (Verdict, bool) {
	for _, a := range p.AllowOut {
		if a.Contains(dst) {
			return Verdict{Allow: true, Rule: "allowOut " + prefixName(a)}, true
		}
	}
	return Verdict{}, false
}

func (p Policy) denyOrDefault(dst netip.Addr) Verdict {
	for _, d := range p.DenyOut {
		if d.Contains(dst) {
			return Verdict{Allow: false, Rule: "denyOut " + prefixName(d)}
		}
	}
	if p.AllowInternet {
		return Verdict{Allow: true, Rule: "default: internet access allowed"}
	}
	return Verdict{Allow: false, Rule: "default: internet access denied (allow_internet_access false)"}
}

// DecideName decides a connection to dst that named name (TLS SNI or HTTP
// Host). ByName reports that only the name allowed it, so the proxy must
// connect to what name resolves to, not to the address the sandbox chose.
func (p Policy) DecideName(name string, dst netip.Addr) (v Verdict, byName bool) {
	if v, ok := p.matchAllowIP(dst); ok {
		return v, false
	}
	if name != "" {
		if d, ok := p.AllowsDomain(name); ok {
			return Verdict{Allow: true, Rule: "allowOut " + d}, true
		}
	}
	return p.denyOrDefault(dst), false
}

func prefixName(p netip.Prefix) string {
	if p.Bits() == 0 {
		return AllTraffic
	}
	if p.Bits() == 32 {
		return p.Addr().String()
	}
	return p.String()
}
