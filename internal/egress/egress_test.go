package egress

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/net/dns/dnsmessage"

	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/network"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/testutil"
)

// env is a sandbox network (without a container) behind the egress proxy,
// and a fake internet.
type env struct {
	fake  *testutil.FakeNet
	nw    *network.Manager
	eg    *Server
	audit *audit.Log
	ep    network.Endpoint
}

func newEnv(t testing.TB, p network.Policy) *env {
	testutil.RequireRoot(t)
	ctx := context.Background()
	fake := testutil.NewFakeNet(t, "egr", netip.MustParsePrefix("198.18.2.0/24"), 3, map[string]netip.Addr{
		"allowed.test":     netip.MustParseAddr("198.18.2.10"),
		"api.allowed.test": netip.MustParseAddr("198.18.2.11"),
		"sub.wild.test":    netip.MustParseAddr("198.18.2.11"),
		"other.test":       netip.MustParseAddr("198.18.2.12"),
		"private.test":     netip.MustParseAddr("10.255.255.1"),
	})
	cfg := network.Config{Bridge: "abegr0", Subnet: netip.MustParsePrefix("10.97.0.0/24"), NetNSDir: t.TempDir(), Table: "agentbox_test_egress"}
	nw, err := network.New(cfg, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(ctx, t.TempDir()+"/db")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	al := audit.New(st)
	secret := make([]byte, 32)
	rand.Read(secret)
	eg := New(Config{Gateway: nw.Gateway(), Subnet: cfg.Subnet, Nameservers: []string{fake.DNS.String()},
		RootCAs: fake.CAPool, CASecret: secret, Audit: al, PeekTimeout: 2 * time.Second}, slog.Default())
	ports, err := eg.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	nw.SetEgress(eg, ports)
	t.Cleanup(func() {
		eg.Close()
		if l, err := netlink.LinkByName(cfg.Bridge); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	if err := nw.Setup(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteTables(cfg.Table) })
	ep, err := nw.Attach(ctx, "egs", p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nw.Detach(ctx, "egs") })
	return &env{fake: fake, nw: nw, eg: eg, audit: al, ep: ep}
}

// dial opens a TCP connection from inside the sandbox netns.
func (e *env) dial(ctx context.Context, addr string) (net.Conn, error) {
	return testutil.InNetNS(e.ep.NetNSPath, func() (net.Conn, error) {
		// Generous: on a loaded machine the new veth can take a second or
		// two to pass its first SYN.
		d := net.Dialer{Timeout: 10 * time.Second}
		d.SetMultipathTCP(false)
		return d.DialContext(ctx, "tcp4", addr)
	})
}

// resolver asks the sandbox's nameserver, the resolver at the gateway.
func (e *env) resolver() *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return testutil.InNetNS(e.ep.NetNSPath, func() (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "udp4", net.JoinHostPort(e.nw.Gateway().String(), "53"))
		})
	}}
}

// query sends one A query for name to server (address:port) from inside
// the sandbox over network (udp4 or tcp4) and returns the answer's code.
func (e *env) query(network, server, name string) (dnsmessage.RCode, error) {
	return testutil.InNetNS(e.ep.NetNSPath, func() (dnsmessage.RCode, error) {
		d := net.Dialer{Timeout: 3 * time.Second}
		c, err := d.Dial(network, server)
		if err != nil {
			return 0, err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 7, RecursionDesired: true})
		_ = b.StartQuestions()
		_ = b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name + "."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
		q, _ := b.Finish()
		if network == "tcp4" {
			q = append([]byte{byte(len(q) >> 8), byte(len(q))}, q...)
		}
		if _, err := c.Write(q); err != nil {
			return 0, err
		}
		buf := make([]byte, 1500)
		n, err := c.Read(buf)
		if err != nil {
			return 0, err
		}
		if network == "tcp4" {
			buf, n = buf[2:], n-2
		}
		var p dnsmessage.Parser
		h, err := p.Start(buf[:n])
		if err != nil {
			return 0, err
		}
		return h.RCode, nil
	})
}

// client is an HTTP client inside the sandbox trusting roots.
func (e *env) client(roots *x509.CertPool) *http.Client {
	res := e.resolver()
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		TLSClientConfig:   &tls.Config{RootCAs: roots},
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			host, port, _ := net.SplitHostPort(addr)
			if _, err := netip.ParseAddr(host); err != nil {
				ips, err := res.LookupNetIP(ctx, "ip4", host)
				if err != nil {
					return nil, err
				}
				host = ips[0].String()
			}
			return e.dial(ctx, net.JoinHostPort(host, port))
		},
	}}
}

func (e *env) get(t *testing.T, c *http.Client, url string, hdr ...string) (*http.Response, testutil.Echo, error) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i] == "Host" {
			req.Host = hdr[i+1]
		} else {
			req.Header.Set(hdr[i], hdr[i+1])
		}
	}
	resp, err := c.Do(req)
	var echo testutil.Echo
	if err != nil {
		return nil, echo, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(b, &echo)
	return resp, echo, nil
}

func deleteTables(name string) {
	for _, fam := range []string{"inet", "bridge"} {
		_ = exec.Command("nft", "delete", "table", fam, name).Run()
	}
}

func wantOK(t *testing.T, what string, resp *http.Response, err error) {
	t.Helper()
	if err != nil {
		t.Errorf("%s: %v", what, err)
		return
	}
	if resp.StatusCode != http.StatusOK {
		t.Errorf("%s: %s", what, resp.Status)
	}
}

// wantBlocked accepts any fast failure: NXDOMAIN, reset, refusal, 403.
func wantBlocked(t *testing.T, what string, resp *http.Response, err error, took time.Duration) {
	t.Helper()
	if err == nil && resp.StatusCode != http.StatusForbidden {
		t.Errorf("%s: %s, want blocked", what, resp.Status)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Errorf("%s: timed out (%v), want an immediate failure", what, err)
	}
	if took > 2*time.Second {
		t.Errorf("%s: took %s to fail", what, took)
	}
}

func (e *env) events(t *testing.T) []audit.Event {
	t.Helper()
	// Records are written when a connection ends; give the last one a moment.
	time.Sleep(100 * time.Millisecond)
	evs, err := e.audit.Query(context.Background(), audit.Query{SandboxID: "egs", Kinds: []string{audit.KindEgress}})
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

func findEvent(evs []audit.Event, decision, host string) *audit.Event {
	for i := len(evs) - 1; i >= 0; i-- {
		e := evs[i]
		if e.Decision == decision && (host == "" || e.Fields["host"] == host || e.Fields["dst"] == host) {
			return &evs[i]
		}
	}
	return nil
}

func TestEgressPolicy(t *testing.T) {
	e := newEnv(t, network.Policy{AllowInternet: true})
	ctx := context.Background()
	c := e.client(e.fake.CAPool)
	set := func(t *testing.T, p network.Policy) {
		t.Helper()
		if err := e.nw.SetPolicy(ctx, "egs", p); err != nil {
			t.Fatal(err)
		}
	}
	try := func(url string, hdr ...string) (*http.Response, testutil.Echo, error, time.Duration) {
		start := time.Now()
		r, echo, err := e.get(t, c, url, hdr...)
		return r, echo, err, time.Since(start)
	}

	t.Run("default allows the internet, TLS passes through", func(t *testing.T) {
		r, echo, err, _ := try("http://allowed.test/hello")
		wantOK(t, "http", r, err)
		if echo.Host != "allowed.test" || echo.Path != "/hello" {
			t.Errorf("echo %+v", echo)
		}
		r, _, err, _ = try("https://other.test/")
		wantOK(t, "https", r, err)
		if err == nil && r.TLS.PeerCertificates[0].Issuer.CommonName != "agentbox fake internet CA" {
			t.Errorf("TLS was not passed through: issuer %q", r.TLS.PeerCertificates[0].Issuer.CommonName)
		}
		conn, err := e.dial(ctx, "198.18.2.10:7")
		if err != nil {
			t.Fatalf("tcp echo: %v", err)
		}
		fmt.Fprint(conn, "ping")
		buf := make([]byte, 4)
		io.ReadFull(conn, buf)
		conn.Close()
		if string(buf) != "ping" {
			t.Errorf("tcp echo got %q", buf)
		}
		evs := e.events(t)
		ev := findEvent(evs, audit.Allowed, "allowed.test")
		if ev == nil || ev.Action != "request" || ev.Fields["method"] != "GET" || ev.Fields["path"] != "/hello" || ev.Fields["bytesIn"].(float64) == 0 {
			t.Errorf("audit for the HTTP request: %+v", ev)
		}
		if ev := findEvent(evs, audit.Allowed, "other.test"); ev == nil || ev.Fields["proto"] != "tls" {
			t.Errorf("audit for the TLS connection: %+v", ev)
		}
		if ev := findEvent(evs, audit.Allowed, "198.18.2.10:7"); ev == nil || ev.Fields["bytesOut"].(float64) != 4 {
			t.Errorf("audit for the TCP connection: %+v", ev)
		}
	})

	t.Run("deny all", func(t *testing.T) {
		set(t, network.Policy{AllowInternet: false})
		r, _, err, took := try("http://allowed.test/")
		wantBlocked(t, "by name", r, err, took)
		r, _, err, took = try("http://198.18.2.10/")
		wantBlocked(t, "by address", r, err, took)
		r, _, err, took = try("https://198.18.2.10/")
		wantBlocked(t, "https by address", r, err, took)
		// Refused at the SYN: connect() fails, no socket opens and resets.
		if conn, err := e.dial(ctx, "198.18.2.10:7"); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("denied TCP: connect %v, want ECONNREFUSED", err)
			if conn != nil {
				conn.Close()
			}
		}
		evs := e.events(t)
		if ev := findEvent(evs, audit.Denied, "allowed.test"); ev == nil || ev.Action != "dns" {
			t.Errorf("audit for the denied lookup: %+v", ev)
		}
	})

	t.Run("allow by domain and wildcard", func(t *testing.T) {
		set(t, network.Policy{AllowDomains: []string{"allowed.test", "*.wild.test"}, DenyOut: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}})
		r, _, err, _ := try("http://allowed.test/")
		wantOK(t, "allowed http", r, err)
		r, _, err, _ = try("https://allowed.test/")
		wantOK(t, "allowed https", r, err)
		r, _, err, _ = try("https://sub.wild.test/")
		wantOK(t, "wildcard https", r, err)
		r, _, err, took := try("http://other.test/")
		wantBlocked(t, "other by name", r, err, took)
		r, _, err, took = try("http://api.allowed.test/")
		wantBlocked(t, "subdomain of an exact name", r, err, took)
		// A forged Host or SNI does not open the address the sandbox chose:
		// the proxy connects where the allowed name resolves.
		r, echo, err, _ := try("http://198.18.2.12/", "Host", "allowed.test")
		wantOK(t, "forged Host", r, err)
		if echo.Local != "198.18.2.10:80" {
			t.Errorf("forged Host reached %s, want allowed.test's 198.18.2.10:80", echo.Local)
		}
		// A denied Host gets the proxy's 403 saying why.
		req, _ := http.NewRequest(http.MethodGet, "http://198.18.2.12/", nil)
		req.Host = "other.test"
		if r, err := c.Do(req); err != nil {
			t.Errorf("denied Host: %v, want the proxy's 403", err)
		} else {
			b, _ := io.ReadAll(r.Body)
			r.Body.Close()
			if r.StatusCode != http.StatusForbidden || !strings.Contains(string(b), "denyOut ALL_TRAFFIC") {
				t.Errorf("denied Host: %s %q, want 403 naming the rule", r.Status, b)
			}
		}
		// SNI-based deny of HTTPS, without terminating TLS: an
		// access_denied alert.
		conn, err := e.dial(ctx, "198.18.2.12:443")
		if err == nil {
			tc := tls.Client(conn, &tls.Config{ServerName: "other.test", RootCAs: e.fake.CAPool})
			err = tc.Handshake()
			tc.Close()
		}
		if err == nil || !strings.Contains(err.Error(), "access denied") {
			t.Errorf("TLS to other.test by address: %v, want an access_denied alert", err)
		}
		// Other ports need no name: refused at the SYN.
		if _, err := e.dial(ctx, "198.18.2.12:7"); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("port 7 with domain rules: %v, want ECONNREFUSED", err)
		}
		evs := e.events(t)
		if ev := findEvent(evs, audit.Denied, "other.test"); ev == nil || ev.Reason != "denyOut ALL_TRAFFIC" {
			t.Errorf("audit for denied SNI: %+v", ev)
		}
		if ev := findEvent(evs, audit.Allowed, "sub.wild.test"); ev == nil || ev.Reason != "allowOut *.wild.test" {
			t.Errorf("audit for the wildcard: %+v", ev)
		}
	})

	t.Run("allow by CIDR, deny wins over the default", func(t *testing.T) {
		set(t, network.Policy{AllowOut: []netip.Prefix{netip.MustParsePrefix("198.18.2.12/32")}, DenyOut: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}})
		r, _, err, _ := try("http://198.18.2.12/")
		wantOK(t, "CIDR by address", r, err)
		// An address range opens addresses, not names: with the internet
		// off the resolver answers only names in allowOut.
		r, _, err, took := try("http://other.test/")
		wantBlocked(t, "name resolving into the CIDR", r, err, took)
		r, _, err, took = try("http://198.18.2.10/")
		wantBlocked(t, "outside the CIDR", r, err, took)
		r, _, err, took = try("http://allowed.test/")
		wantBlocked(t, "name outside the CIDR", r, err, took)

		set(t, network.Policy{AllowInternet: true, DenyOut: []netip.Prefix{netip.MustParsePrefix("198.18.2.11/32")}})
		r, _, err, _ = try("http://198.18.2.10/")
		wantOK(t, "not denied", r, err)
		r, _, err, took = try("https://api.allowed.test/")
		wantBlocked(t, "denied address", r, err, took)
	})

	t.Run("platform ranges stay closed whatever allowOut says", func(t *testing.T) {
		set(t, network.Policy{AllowInternet: true, AllowOut: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}, AllowDomains: []string{"private.test"}})
		for _, addr := range []string{e.nw.Gateway().String() + ":80", "10.255.255.1:80", "169.254.169.254:80", "127.0.0.1:80"} {
			conn, err := e.dial(ctx, addr)
			if err == nil {
				conn.SetReadDeadline(time.Now().Add(2 * time.Second))
				_, err = conn.Read(make([]byte, 1))
				conn.Close()
			}
			var ne net.Error
			if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
				t.Errorf("%s: %v, want an immediate reset or refusal", addr, err)
			}
		}
		// A name resolving into a private range does not open it either.
		set(t, network.Policy{AllowDomains: []string{"private.test"}})
		r, _, err, _ := try("http://198.18.2.10/", "Host", "private.test")
		if err != nil || r.StatusCode != http.StatusBadGateway {
			t.Errorf("allowed name resolving to a private address: %v %v, want 502", r, err)
		}
		if ev := findEvent(e.events(t), audit.Denied, "10.255.255.1:80"); ev != nil && !strings.HasPrefix(ev.Reason, "platform") {
			t.Errorf("audit: %+v", ev)
		}
	})

	t.Run("live update", func(t *testing.T) {
		set(t, network.Policy{AllowInternet: false})
		r, _, err, took := try("http://198.18.2.10/")
		wantBlocked(t, "before", r, err, took)
		set(t, network.Policy{AllowInternet: true})
		r, _, err, _ = try("http://198.18.2.10/")
		wantOK(t, "after", r, err)
	})

	t.Run("header injection", func(t *testing.T) {
		const secret = "s3cret-value-123"
		set(t, network.Policy{AllowInternet: true, Rules: []network.DomainRules{{Pattern: "api.allowed.test",
			Transforms: []network.HeaderTransform{{Headers: map[string]string{"Authorization": "Bearer " + secret, "X-Extra": "1"}}}}}})
		caPEM, err := e.eg.CACertPEM("egs")
		if err != nil {
			t.Fatal(err)
		}
		roots := e.fake.CAPool.Clone()
		roots.AppendCertsFromPEM(caPEM)
		c := e.client(roots)
		r, echo, err := e.get(t, c, "https://api.allowed.test/v1", "Authorization", "Bearer placeholder")
		wantOK(t, "https with rules", r, err)
		if got := strings.Join(echo.Headers["Authorization"], ","); got != testutil.HashSecret("Bearer "+secret) {
			t.Errorf("upstream saw Authorization %q", got)
		}
		if err == nil && !strings.HasPrefix(r.TLS.PeerCertificates[0].Issuer.CommonName, "agentbox egress CA") {
			t.Errorf("not terminated by the sandbox CA: issuer %q", r.TLS.PeerCertificates[0].Issuer.CommonName)
		}
		// Plain HTTP carries no credentials unless the rule opts in.
		r, echo, err = e.get(t, c, "http://api.allowed.test/v1")
		wantOK(t, "http with rules", r, err)
		if got := echo.Headers["Authorization"]; len(got) != 0 {
			t.Errorf("upstream saw Authorization %q over plain HTTP without allowPlainHTTP", got)
		}
		set(t, network.Policy{AllowInternet: true, Rules: []network.DomainRules{{Pattern: "api.allowed.test",
			Transforms: []network.HeaderTransform{{Headers: map[string]string{"Authorization": "Bearer " + secret}, AllowPlainHTTP: true}}}}})
		r, echo, err = e.get(t, c, "http://api.allowed.test/v1")
		wantOK(t, "http with allowPlainHTTP", r, err)
		if got := strings.Join(echo.Headers["Authorization"], ","); got != testutil.HashSecret("Bearer "+secret) {
			t.Errorf("upstream saw Authorization %q over HTTP with allowPlainHTTP", got)
		}
		r, echo, err = e.get(t, c, "https://allowed.test/")
		wantOK(t, "https without rules", r, err)
		if len(echo.Headers["Authorization"]) != 0 || (err == nil && r.TLS.PeerCertificates[0].Issuer.CommonName != "agentbox fake internet CA") {
			t.Errorf("a domain without rules was touched: %+v", echo.Headers)
		}
		// An untrusted CA makes the sandbox refuse, it is not bypassed.
		_, _, err = e.get(t, e.client(e.fake.CAPool), "https://api.allowed.test/")
		if err == nil {
			t.Error("client without the sandbox CA accepted the proxy's certificate")
		}
	})

	t.Run("upstream SOCKS5 proxy", func(t *testing.T) {
		carried := e.fake.SOCKS5(t, "198.18.2.12:1080", "u", "p")
		set(t, network.Policy{AllowInternet: true, Upstream: &network.UpstreamProxy{Scheme: "socks5", Address: "198.18.2.12:1080", Username: "u", Password: "p"}})
		r, _, err, _ := try("http://allowed.test/")
		wantOK(t, "http via socks", r, err)
		r, _, err, _ = try("https://allowed.test/")
		wantOK(t, "https via socks", r, err)
		if n := carried(); n < 2 {
			t.Errorf("upstream proxy carried %d connections, want 2", n)
		}
		set(t, network.Policy{AllowInternet: true, Upstream: &network.UpstreamProxy{Scheme: "socks5", Address: "198.18.2.12:1080", Username: "u", Password: "wrong"}})
		r, _, err, took := try("https://allowed.test/")
		wantBlocked(t, "bad upstream credentials fail closed", r, err, took)
	})
}

func TestAuthorityStable(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	a, err := newAuthority(secret, "sbx1")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := newAuthority(secret, "sbx1")
	c, _ := newAuthority(secret, "sbx2")
	if !a.key.Equal(b.key) || a.cert.SerialNumber.Cmp(b.cert.SerialNumber) != 0 {
		t.Error("the same sandbox got a different CA key after a restart")
	}
	if a.key.Equal(c.key) {
		t.Error("two sandboxes share a CA key")
	}
	leaf, err := b.leaf("api.example.com")
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(a.cert) // trusted before the "restart"
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{DNSName: "api.example.com", Roots: pool}); err != nil {
		t.Errorf("leaf from the re-derived CA does not verify against the old one: %v", err)
	}
}
