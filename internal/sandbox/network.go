package sandbox

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/net/http/httpguts"

	"github.com/agentbox/agentbox/internal/envdclient"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/network"
)

// NetworkSpec is a sandbox's network configuration in E2B's wire shape,
// kept with the sandbox so it survives restarts and shows in its info.
// Header values may reference team secrets as ${secrets.NAME}; they are
// resolved only into the egress proxy's memory.
type NetworkSpec struct {
	AllowOut           []string                 `json:"allowOut,omitempty"`
	DenyOut            []string                 `json:"denyOut,omitempty"`
	AllowPublicTraffic *bool                    `json:"allowPublicTraffic,omitempty"`
	MaskRequestHost    string                   `json:"maskRequestHost,omitempty"`
	HTTPSPorts         []int                    `json:"httpsPorts,omitempty"`
	Rules              map[string][]NetworkRule `json:"rules,omitempty"`
	EgressProxy        *EgressProxy             `json:"egressProxy,omitempty"`
}

// NetworkRule is E2B's SandboxNetworkRule. The egress proxy adds the
// headers only to requests it sends itself to where the rule's domain
// resolves (never to an address the sandbox chose), over HTTPS verified
// against the host's roots.
type NetworkRule struct {
	Transform *struct {
		Headers map[string]string `json:"headers,omitempty"`
	} `json:"transform,omitempty"`
	// AllowPlainHTTP (an agentbox extension, default false) also adds the
	// headers to plain-HTTP requests on port 80, where every network on
	// the way can read them.
	AllowPlainHTTP bool `json:"allowPlainHTTP,omitempty"`
}

// EgressProxy is E2B's SandboxEgressProxyConfig. Address is host:port
// (SOCKS5, as E2B) or socks5://host:port or http://host:port (CONNECT).
type EgressProxy struct {
	Address  string `json:"address"`
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
}

// PublicTraffic reports whether the sandbox's ports are reachable without
// the traffic access token.
func (n *NetworkSpec) PublicTraffic() bool {
	return n == nil || n.AllowPublicTraffic == nil || *n.AllowPublicTraffic
}

// secretRef matches ${secrets.NAME} in header values.
var secretRef = regexp.MustCompile(`\$\{secrets\.([^}]*)\}`)

var secretName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)

// ValidSecretName reports whether name can be stored and referenced.
func ValidSecretName(name string) bool { return secretName.MatchString(name) }

// forbiddenHeaders would break or smuggle requests if a rule set them.
var forbiddenHeaders = []string{"host", "content-length", "transfer-encoding", "connection", "upgrade", "te", "trailer", "keep-alive", "proxy-connection"}

const (
	maxNetworkEntries = 256
	maxRuleDomains    = 64
	maxRuleHeaders    = 32
)

func invalid(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, errdefs.ErrInvalidArgument)...)
}

// policies turns sandboxes' network settings into network policies,
// resolving the team's secret references. It is the one place a network
// setting is validated, on create, update and restore alike.
type policies struct{ secrets secretValues }

// secretValues is the store's side of a policy: a team's secrets.
type secretValues interface {
	TeamSecretValue(ctx context.Context, teamID, name string) (string, error)
}

// of turns the sandbox's network settings into the network policy,
// resolving secret references. Errors name the offending entry.
func (ps policies) of(ctx context.Context, sb *Sandbox) (network.Policy, error) {
	return ps.policy(ctx, sb.TeamID, sb.APIKeyID, sb.AllowInternet, sb.Network)
}

func (ps policies) policy(ctx context.Context, teamID, keyID string, allowInternet bool, n *NetworkSpec) (network.Policy, error) {
	p := network.Policy{AllowInternet: allowInternet, TeamID: teamID, APIKeyID: keyID}
	if n == nil {
		return p, nil
	}
	if len(n.AllowOut) > maxNetworkEntries || len(n.DenyOut) > maxNetworkEntries {
		return p, invalid("network: at most %d allowOut and %d denyOut entries", maxNetworkEntries, maxNetworkEntries)
	}
	var err error
	if p.AllowOut, p.AllowDomains, err = network.ParseAllowOut("network.allowOut", n.AllowOut); err != nil {
		return p, err
	}
	if p.DenyOut, err = network.ParseDenyOut("network.denyOut", n.DenyOut); err != nil {
		return p, err
	}
	for _, d := range p.DenyOut {
		if d.Bits() == 0 {
			// denyOut ALL_TRAFFIC is allow_internet_access: false.
			p.AllowInternet = false
		}
	}
	if len(p.AllowDomains) > 0 && p.AllowInternet {
		return p, invalid("network.allowOut: domains (%s) only restrict anything with denyOut [\"%s\"] (E2B semantics); add it, or drop the domains", strings.Join(p.AllowDomains, ", "), network.AllTraffic)
	}
	for _, port := range n.HTTPSPorts {
		if port < 1 || port > 65535 || port == EnvdPort {
			return p, invalid("network.httpsPorts: %d is not a sandbox port that can serve HTTPS (1-65535, not envd's %d)", port, EnvdPort)
		}
	}
	if len(n.MaskRequestHost) > 255 || strings.ContainsAny(n.MaskRequestHost, " \r\n\t/") {
		return p, invalid("network.maskRequestHost: %q is not a host[:port]", n.MaskRequestHost)
	}
	if len(n.Rules) > maxRuleDomains {
		return p, invalid("network.rules: at most %d domains", maxRuleDomains)
	}
	domains := make([]string, 0, len(n.Rules))
	for d := range n.Rules {
		domains = append(domains, d)
	}
	sort.Strings(domains)
	for _, d := range domains {
		field := "network.rules[" + strconv.Quote(d) + "]"
		if network.LooksLikeAddress(d) {
			return p, invalid("%s: rules name a domain, not an address: the proxy sends credentials only where that domain resolves", field)
		}
		pattern, err := network.ParseDomain(field, d)
		if err != nil {
			return p, err
		}
		dr := network.DomainRules{Pattern: pattern}
		for i, r := range n.Rules[d] {
			if r.Transform == nil {
				if r.AllowPlainHTTP {
					return p, invalid("%s[%d].allowPlainHTTP: only meaningful with transform.headers", field, i)
				}
				continue
			}
			if len(r.Transform.Headers) > maxRuleHeaders {
				return p, invalid("%s[%d].transform.headers: at most %d headers", field, i, maxRuleHeaders)
			}
			t := network.HeaderTransform{Headers: map[string]string{}, AllowPlainHTTP: r.AllowPlainHTTP}
			for k, v := range r.Transform.Headers {
				hf := fmt.Sprintf("%s[%d].transform.headers[%q]", field, i, k)
				if !httpguts.ValidHeaderFieldName(k) || slices.Contains(forbiddenHeaders, strings.ToLower(k)) {
					return p, invalid("%s: not a header name a rule may set", hf)
				}
				val, err := ps.resolveSecrets(ctx, teamID, hf, v)
				if err != nil {
					return p, err
				}
				t.Headers[k] = val
			}
			dr.Transforms = append(dr.Transforms, t)
		}
		if len(dr.Transforms) > 0 {
			p.Rules = append(p.Rules, dr)
		}
	}
	if ep := n.EgressProxy; ep != nil {
		up, err := parseEgressProxy(ep)
		if err != nil {
			return p, err
		}
		p.Upstream = up
	}
	return p, nil
}

func (ps policies) resolveSecrets(ctx context.Context, teamID, field, v string) (string, error) {
	var firstErr error
	out := secretRef.ReplaceAllStringFunc(v, func(ref string) string {
		name := secretRef.FindStringSubmatch(ref)[1]
		if !ValidSecretName(name) {
			firstErr = cmpErr(firstErr, invalid("%s: %q is not a valid secret name", field, name))
			return ""
		}
		val, err := ps.secrets.TeamSecretValue(ctx, teamID, name)
		if err != nil {
			firstErr = cmpErr(firstErr, invalid("%s: secret %q does not exist; create it with POST /secrets", field, name))
			return ""
		}
		return val
	})
	if firstErr != nil {
		return "", firstErr
	}
	if !httpguts.ValidHeaderFieldValue(out) {
		return "", invalid("%s: the value is not a valid header value (no CR, LF or NUL)", field)
	}
	return out, nil
}

func cmpErr(prev, err error) error {
	if prev != nil {
		return prev
	}
	return err
}

func parseEgressProxy(ep *EgressProxy) (*network.UpstreamProxy, error) {
	addr := ep.Address
	scheme := "socks5"
	if i := strings.Index(addr, "://"); i >= 0 {
		u, err := url.Parse(addr)
		if err != nil || (u.Scheme != "socks5" && u.Scheme != "http") || u.Host == "" || (u.Path != "" && u.Path != "/") {
			return nil, invalid("network.egressProxy.address: %q is not host:port, socks5://host:port or http://host:port", addr)
		}
		scheme, addr = u.Scheme, u.Host
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return nil, invalid("network.egressProxy.address: %q is not host:port", ep.Address)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return nil, invalid("network.egressProxy.address: port %q is not 1-65535", port)
	}
	if len(ep.Username) > 255 || len(ep.Password) > 255 {
		return nil, invalid("network.egressProxy: username and password are at most 255 bytes")
	}
	if ep.Password != "" && ep.Username == "" {
		return nil, invalid("network.egressProxy.password: only valid with a username")
	}
	return &network.UpstreamProxy{Scheme: scheme, Address: addr, Username: ep.Username, Password: ep.Password}, nil
}

// CheckNetwork validates a network configuration for a create or update
// of teamID (secrets must exist) without applying it.
// A nil manager checks all but secret references, which need the store
// (the API's validation tests use one).
func (m *Manager) CheckNetwork(ctx context.Context, teamID string, allowInternet bool, n *NetworkSpec) error {
	var ps policies
	if m != nil {
		ps = m.policies
	}
	_, err := ps.policy(ctx, teamID, "", allowInternet, n)
	return err
}

// UpdateNetwork replaces a running sandbox's egress settings (PUT
// /sandboxes/{id}/network). Ingress settings (allowPublicTraffic,
// maskRequestHost, httpsPorts) are kept.
func (m *Manager) UpdateNetwork(ctx context.Context, teamID, id string, allowInternet bool, n *NetworkSpec) error {
	cur, err := m.Get(ctx, teamID, id)
	if err != nil {
		return err
	}
	next := &NetworkSpec{}
	if n != nil {
		*next = *n
	}
	if old := cur.Network; old != nil {
		next.AllowPublicTraffic, next.MaskRequestHost, next.HTTPSPorts = old.AllowPublicTraffic, old.MaskRequestHost, old.HTTPSPorts
	}
	cur.AllowInternet, cur.Network = allowInternet, next
	pol, err := m.policies.of(ctx, cur)
	if err != nil {
		return err
	}
	if err := m.net.SetPolicy(ctx, id, pol); err != nil {
		return err
	}
	if err := m.envd.installCA(ctx, cur, pol); err != nil {
		return err
	}
	if err := m.envd.push(ctx, cur); err != nil {
		return err
	}
	if err := m.update(ctx, teamID, id, func(sb *Sandbox) { sb.AllowInternet, sb.Network = allowInternet, next }); err != nil {
		return err
	}
	m.inst.auditLifecycle(ctx, cur, "update", "allowed", "", map[string]any{"network_egress": map[string]any{
		"allow_internet": allowInternet, "allowed_destinations": next.AllowOut, "denied_destinations": next.DenyOut}})
	return nil
}

// restore puts a re-adopted sandbox's policy back after a restart.
func (ps policies) restore(ctx context.Context, nw Network, log *slog.Logger, sb *Sandbox) error {
	pol, err := ps.of(ctx, sb)
	if err != nil {
		// A secret was deleted meanwhile: keep the sandbox, without rules.
		log.Warn("sandbox network rules no longer valid; applying them without header rules", "sandbox", sb.ID, "err", err)
		pol, err = ps.policy(ctx, sb.TeamID, sb.APIKeyID, sb.AllowInternet, withoutRules(sb.Network))
		if err != nil {
			return err
		}
	}
	return nw.SetPolicy(ctx, sb.ID, pol)
}

func withoutRules(n *NetworkSpec) *NetworkSpec {
	if n == nil {
		return nil
	}
	c := *n
	c.Rules = nil
	return &c
}

// TrafficToken is the e2b-traffic-access-token of a sandbox created with
// allowPublicTraffic false: stable for its life, derived, never stored.
func (m *Manager) TrafficToken(id string) string { return TrafficToken(m.envd.secret, id) }

// TrafficToken derives sandbox id's traffic token from secret.
func TrafficToken(secret []byte, id string) string {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte("sandbox-traffic-" + id))
	return hex.EncodeToString(h.Sum(nil))[:40]
}

// egressCA is implemented by network.Manager when it has an egress proxy.
type egressCA interface {
	EgressCA(id string) ([]byte, error)
}

// caPath is where the sandbox's egress CA goes, for tools that read a
// single file (NODE_EXTRA_CA_CERTS, REQUESTS_CA_BUNDLE).
const caPath = "/usr/local/share/ca-certificates/agentbox-egress.crt"

// caBundle is Debian's (and Ubuntu's) system bundle, read by OpenSSL,
// curl, Python's ssl and Go.
const caBundle = "/etc/ssl/certs/ca-certificates.crt"

// installCA makes the sandbox trust its egress CA when header rules
// make the proxy terminate TLS: it writes the certificate and appends it to
// the system bundle, through envd. Doing it only when rules exist keeps the
// proxy out of every other TLS session.
func (e *envdLink) installCA(ctx context.Context, sb *Sandbox, pol network.Policy) error {
	return e.installCAWith(ctx, e.of(sb), sb, pol)
}

// installCAWith is installCA through c (a restored envd still
// holds the token of the sandbox it was checkpointed from).
func (e *envdLink) installCAWith(ctx context.Context, c *envdclient.Client, sb *Sandbox, pol network.Policy) error {
	if len(pol.Rules) == 0 {
		return nil
	}
	src, ok := e.net.(egressCA)
	if !ok {
		return nil
	}
	pem, err := src.EgressCA(sb.ID)
	if err != nil {
		return fmt.Errorf("egress CA: %w", err)
	}
	bundle, err := c.ReadFile(ctx, caBundle, "root")
	if err != nil {
		bundle = nil // no system bundle in this template: start one
	}
	if bytes.Contains(bundle, bytes.TrimSpace(pem)) {
		return nil
	}
	if err := c.WriteFile(ctx, caPath, "root", pem); err != nil {
		return fmt.Errorf("install egress CA: %w", err)
	}
	if len(bundle) > 0 && !bytes.HasSuffix(bundle, []byte("\n")) {
		bundle = append(bundle, '\n')
	}
	if err := c.WriteFile(ctx, caBundle, "root", append(bundle, pem...)); err != nil {
		return fmt.Errorf("install egress CA: %w", err)
	}
	return nil
}
