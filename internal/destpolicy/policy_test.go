package destpolicy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/agentbox/agentbox/internal/errdefs"
)

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		addr string
		want Class
	}{
		{"127.0.0.1", Loopback},
		{"127.255.255.254", Loopback},
		{"::1", Loopback},
		{"::ffff:127.0.0.1", Loopback},
		{"2002:7f00:1::1", Loopback}, // 6to4 of 127.0.0.1
		{"0.0.0.0", Unspecified},
		{"0.1.2.3", Unspecified},
		{"::", Unspecified},
		{"::127.0.0.1", Unspecified}, // IPv4-compatible
		{"169.254.169.254", LinkLocal},
		{"::ffff:169.254.169.254", LinkLocal},
		{"64:ff9b::a9fe:a9fe", LinkLocal}, // NAT64 of 169.254.169.254
		{"fe80::1", LinkLocal},
		{"fe80::1%eth0", LinkLocal},
		{"fd00:ec2::254", Private},
		{"fc00::1", Private},
		{"fec0::1", Private},
		{"10.1.2.3", Private},
		{"172.16.0.1", Private},
		{"172.31.255.255", Private},
		{"192.168.1.1", Private},
		{"::ffff:10.0.0.1", Private},
		{"100.64.0.1", Shared},
		{"100.127.255.255", Shared},
		{"224.0.0.1", Multicast},
		{"ff02::1", Multicast},
		{"255.255.255.255", Broadcast},
		{"240.0.0.1", Reserved},
		{"8.8.8.8", Public},
		{"100.128.0.1", Public},
		{"172.32.0.1", Public},
		{"2001:4860:4860::8888", Public},
		{"64:ff9b::808:808", Public},
	} {
		if got := Classify(netip.MustParseAddr(tc.addr)); got != tc.want {
			t.Errorf("Classify(%s) = %v, want %v", tc.addr, got, tc.want)
		}
	}
}

func TestParseAllowed(t *testing.T) {
	for _, tc := range []struct {
		in, want string // want "" means refused
	}{
		{"127.0.0.1:5000", "127.0.0.1:5000"},
		{"127.0.0.1", "127.0.0.1"},
		{"10.0.0.0/24", "10.0.0.0/24"},
		{"10.0.0.7/24", "10.0.0.0/24"},
		{"[::1]:5000", "[::1]:5000"},
		{"Registry.LAN.:5000", "registry.lan:5000"},
		{"registry.lan", "registry.lan"},
		{"0.0.0.0/0", ""},
		{"::/0", ""},
		{"registry.lan:0", ""},
		{"registry.lan:99999", ""},
		{"2130706433", ""},
		{"0177.0.0.1:5000", ""},
		{"", ""},
		{"http://registry.lan", ""},
	} {
		a, err := ParseAllowed(tc.in)
		switch {
		case tc.want == "" && err == nil:
			t.Errorf("ParseAllowed(%q) = %v, want an error", tc.in, a)
		case tc.want == "" && !errors.Is(err, errdefs.ErrInvalidArgument):
			t.Errorf("ParseAllowed(%q): %v, want ErrInvalidArgument", tc.in, err)
		case tc.want != "" && (err != nil || a.String() != tc.want):
			t.Errorf("ParseAllowed(%q) = %v, %v; want %s", tc.in, a, err, tc.want)
		}
	}
}

func TestParseLegacyIPv4(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"127.1", "127.0.0.1"},
		{"2130706433", "127.0.0.1"},
		{"0177.0.0.1", "127.0.0.1"},
		{"0x7f.0.0.1", "127.0.0.1"},
		{"0x7f000001", "127.0.0.1"},
		{"0xa9.0xfe.0xa9.0xfe", "169.254.169.254"},
		{"169.254.43518", "169.254.169.254"},
		{"1.2.3", "1.2.0.3"},
		{"1.2.3.4.5", ""},
		{"256.1.1.1", ""},
		{"1.2.3.256", ""},
		{"registry", ""},
		{"a.b", ""},
		{"1..2", ""},
	} {
		a, ok := parseLegacyIPv4(tc.in)
		if got := map[bool]string{true: a.String(), false: ""}[ok]; got != tc.want {
			t.Errorf("parseLegacyIPv4(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestCheck(t *testing.T) {
	var allow []Allowed
	for _, s := range []string{"127.0.0.1:5000", "registry.lan", "10.0.0.0/24", "[fd00::5]:443"} {
		a, err := ParseAllowed(s)
		if err != nil {
			t.Fatal(err)
		}
		allow = append(allow, a)
	}
	host := netip.MustParseAddr("203.0.113.7")
	p := New(Config{
		Allow: allow,
		Deny:  []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("10.0.0.128/25")},
		HostAddrs: func() ([]netip.Addr, error) {
			return []netip.Addr{netip.MustParseAddr("127.0.0.1"), host}, nil
		},
	})
	for _, tc := range []struct {
		host, addr string
		port       uint16
		refused    string // "" means allowed
	}{
		{"8.8.8.8", "8.8.8.8", 443, ""},
		{"registry.example", "8.8.8.8", 443, ""},
		{"127.0.0.1", "127.0.0.1", 5000, ""},
		{"127.0.0.1", "127.0.0.1", 5001, "127.0.0.1:5001 is a loopback address"},
		{"localhost", "127.0.0.1", 80, "localhost:80 resolves to a loopback address"},
		{"::ffff:127.0.0.1", "::ffff:127.0.0.1", 80, "is a loopback address"},
		{"169.254.169.254", "169.254.169.254", 80, "link-local"},
		{"fd00:ec2::254", "fd00:ec2::254", 80, "private"},
		{"metadata.example", "169.254.169.254", 80, "metadata.example:80 resolves to a link-local address"},
		{"registry.lan", "192.168.1.9", 5000, ""},
		{"Registry.Lan.", "192.168.1.9", 443, ""},
		{"other.lan", "192.168.1.9", 5000, "private network"},
		{"10.0.0.5", "10.0.0.5", 5000, ""},
		{"10.0.0.200", "10.0.0.200", 5000, "sandbox or cluster network"}, // deny wins over a CIDR allow
		{"10.0.1.5", "10.0.1.5", 5000, "private network"},
		{"fd00::5", "fd00::5", 443, ""},
		{"fd00::5", "fd00::5", 80, "private"},
		{"100.64.1.1", "100.64.1.1", 80, "carrier-grade NAT"},
		{"198.51.100.9", "198.51.100.9", 443, "sandbox or cluster network"},
		{"203.0.113.7", "203.0.113.7", 443, "an address of this host"},
		{"myhost.example", "203.0.113.7", 443, "resolves to an address of this host"},
		{"255.255.255.255", "255.255.255.255", 80, "broadcast"},
		{"224.0.0.251", "224.0.0.251", 80, "multicast"},
		{"0.0.0.0", "0.0.0.0", 80, "unspecified"},
	} {
		dest := net.JoinHostPort(tc.host, fmt.Sprint(tc.port))
		err := p.Check(dest, tc.host, netip.MustParseAddr(tc.addr), tc.port)
		if tc.refused == "" {
			if err != nil {
				t.Errorf("%s -> %s: %v, want allowed", dest, tc.addr, err)
			}
			continue
		}
		var re *RefusedError
		if !errors.As(err, &re) || !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.refused) ||
			!strings.Contains(err.Error(), "--fetch-allow") {
			t.Errorf("%s -> %s: %v, want a refusal with %q", dest, tc.addr, err, tc.refused)
		}
		if re != nil && re.Named && strings.Contains(err.Error(), tc.addr) {
			t.Errorf("%s: the refusal shows the address the name resolved to: %v", dest, err)
		}
	}
}

// TestHostAddrsReadAtConnect: an address the host gains after the policy
// was made is closed too.
func TestHostAddrsReadAtConnect(t *testing.T) {
	var mu sync.Mutex
	var own []netip.Addr
	p := New(Config{HostAddrs: func() ([]netip.Addr, error) {
		mu.Lock()
		defer mu.Unlock()
		return own, nil
	}})
	a := netip.MustParseAddr("203.0.113.50")
	if err := p.Check("x:80", "x", a, 80); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	own = append(own, a)
	mu.Unlock()
	if err := p.Check("x:80", "x", a, 80); err == nil {
		t.Fatal("an address added to the host later is not refused")
	}
}

// secretServer is a service on loopback the policy must keep the server
// from reaching; it counts the requests it gets.
type secretServer struct {
	hits atomic.Int32
	url  string
	port string
}

func listen(t *testing.T, addr string) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

func serve(t *testing.T, ln net.Listener, h http.Handler) {
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

func newSecret(t *testing.T, addr string) *secretServer {
	s := &secretServer{}
	ln := listen(t, addr)
	serve(t, ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.hits.Add(1)
		io.WriteString(w, "SECRET")
	}))
	s.url = "http://" + ln.Addr().String()
	_, s.port, _ = net.SplitHostPort(ln.Addr().String())
	return s
}

func mustAllow(t *testing.T, s ...string) []Allowed {
	var out []Allowed
	for _, x := range s {
		a, err := ParseAllowed(x)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, a)
	}
	return out
}

func wantRefused(t *testing.T, what string, err error, secret *secretServer) {
	t.Helper()
	var re *RefusedError
	if !errors.As(err, &re) {
		t.Errorf("%s: %v, want a refusal", what, err)
	}
	if err != nil && strings.Contains(err.Error(), "SECRET") {
		t.Errorf("%s: the error carries the reply: %v", what, err)
	}
	if n := secret.hits.Load(); n != 0 {
		t.Errorf("%s: the closed server got %d requests", what, n)
	}
}

func TestDialRefusesLoopbackForms(t *testing.T) {
	secret := newSecret(t, "127.0.0.1:0")
	p := New(Config{})
	c := p.Client(0)
	for _, u := range []string{
		secret.url,
		"http://localhost:" + secret.port,
		"http://[::ffff:127.0.0.1]:" + secret.port,
	} {
		resp, err := c.Get(u)
		if err == nil {
			resp.Body.Close()
		}
		wantRefused(t, u, err, secret)
	}
	// Forms a C resolver reads as 127.0.0.1: refused as addresses.
	for _, h := range []string{"2130706433", "0177.0.0.1", "0x7f.0.0.1", "127.1"} {
		resp, err := c.Get("http://" + h + ":" + secret.port)
		if err == nil {
			resp.Body.Close()
			t.Errorf("%s: fetched", h)
		} else if re := (*RefusedError)(nil); !errors.As(err, &re) || !strings.Contains(err.Error(), "write it as a.b.c.d") {
			t.Errorf("%s: %v, want the non-canonical form refused", h, err)
		}
	}
	if n := secret.hits.Load(); n != 0 {
		t.Errorf("the loopback server got %d requests", n)
	}
}

// flipResolver answers each lookup of a name with the next address of its
// list: DNS rebinding.
type flipResolver struct {
	mu      sync.Mutex
	answers []netip.Addr
}

func (r *flipResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.answers) == 0 {
		return nil, fmt.Errorf("%s: no more answers", host)
	}
	a := r.answers[0]
	r.answers = r.answers[1:]
	return []netip.Addr{a}, nil
}

func TestRebinding(t *testing.T) {
	// The same port on 127.0.0.2 (allowed) and 127.0.0.1 (not).
	var okLn net.Listener
	var secret *secretServer
	for range 20 {
		okLn = listen(t, "127.0.0.2:0")
		_, port, _ := net.SplitHostPort(okLn.Addr().String())
		if ln, err := net.Listen("tcp", "127.0.0.1:"+port); err == nil {
			ln.Close()
			secret = newSecret(t, "127.0.0.1:"+port)
			break
		}
		okLn.Close()
	}
	if secret == nil {
		t.Fatal("no port free on both 127.0.0.1 and 127.0.0.2")
	}
	serve(t, okLn, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	res := &flipResolver{answers: []netip.Addr{netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("127.0.0.1")}}
	p := New(Config{Allow: mustAllow(t, "127.0.0.2"), Resolver: res})
	c := p.Client(0)
	u := "http://rebind.test:" + secret.port + "/"
	resp, err := c.Get(u)
	if err != nil {
		t.Fatalf("first answer (allowed): %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "ok" {
		t.Fatalf("first answer: %q", b)
	}
	c.CloseIdleConnections() // the next request dials again
	resp, err = c.Get(u)
	if err == nil {
		resp.Body.Close()
	}
	wantRefused(t, "second answer (loopback)", err, secret)
	if err != nil && strings.Contains(err.Error(), "127.0.0.1") {
		t.Errorf("the refusal shows what the name resolved to: %v", err)
	}
}

func TestRedirects(t *testing.T) {
	secret := newSecret(t, "127.0.0.1:0")
	allowed := listen(t, "127.0.0.2:0")
	serve(t, allowed, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/to-loopback":
			http.Redirect(w, r, secret.url+"/meta", http.StatusFound)
		case "/loop":
			http.Redirect(w, r, "/loop", http.StatusFound)
		default:
			io.WriteString(w, "ok")
		}
	}))
	base := "http://" + allowed.Addr().String()
	p := New(Config{Allow: mustAllow(t, allowed.Addr().String())})
	clients := map[string]*http.Client{
		"Client":               p.Client(0),
		"plain over Transport": {Transport: p.Transport()}, // as a library that makes its own client
	}
	for name, c := range clients {
		resp, err := c.Get(base + "/to-loopback")
		if err == nil {
			resp.Body.Close()
		}
		wantRefused(t, name+": redirect to loopback", err, secret)

		resp, err = c.Get(base + "/loop")
		if err == nil {
			resp.Body.Close()
		}
		if !errors.Is(err, ErrTooManyRedirects) {
			t.Errorf("%s: endless redirects: %v, want ErrTooManyRedirects", name, err)
		}
		resp, err = c.Get(base + "/")
		if err != nil {
			t.Fatalf("%s: allowed destination: %v", name, err)
		}
		resp.Body.Close()
	}
}

// TestEnvironmentProxyIgnored: HTTP_PROXY must not carry a fetch where the
// policy cannot see.
func TestEnvironmentProxyIgnored(t *testing.T) {
	var proxied atomic.Int32
	proxy := listen(t, "127.0.0.2:0")
	serve(t, proxy, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		proxied.Add(1)
		io.WriteString(w, "SECRET metadata")
	}))
	t.Setenv("HTTP_PROXY", "http://"+proxy.Addr().String())
	t.Setenv("http_proxy", "http://"+proxy.Addr().String())
	p := New(Config{Allow: mustAllow(t, proxy.Addr().String())})
	resp, err := p.Client(0).Get("http://169.254.169.254/latest/meta-data/")
	if err == nil {
		resp.Body.Close()
	}
	var re *RefusedError
	if !errors.As(err, &re) || !strings.Contains(err.Error(), "link-local") {
		t.Errorf("metadata through the environment's proxy: %v, want a link-local refusal", err)
	}
	if n := proxied.Load(); n != 0 {
		t.Errorf("the environment's proxy got %d requests", n)
	}
}

func TestDialOnlyTCP(t *testing.T) {
	if _, err := New(Config{}).DialContext(context.Background(), "udp", "8.8.8.8:53"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("udp: %v, want refused", err)
	}
}
