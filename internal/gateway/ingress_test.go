package gateway

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/sandbox"
)

func TestIngress(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") == "websocket" {
			// Enough of a WebSocket server to prove the upgrade streams both
			// ways: switch protocols, then echo raw bytes.
			c, brw, _ := http.NewResponseController(w).Hijack()
			defer c.Close()
			fmt.Fprint(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nService-Worker-Allowed: /\r\n\r\n")
			buf := make([]byte, 5)
			io.ReadFull(brw, buf)
			c.Write(buf)
			return
		}
		// Headers a sandbox app may send to claim more than its host.
		w.Header().Set("Service-Worker-Allowed", "/")
		w.Header().Set("Clear-Site-Data", `"*"`)
		w.Header().Add("Set-Cookie", "a=1; Domain=localhost; Path=/; HttpOnly")
		w.Header().Add("Set-Cookie", "b=2;domain=.sbx.example.com")
		fmt.Fprintf(w, "path=%s prefix=%s host=%s token=%s", r.URL.Path, r.Header.Get("X-Forwarded-Prefix"), r.Host, r.Header.Get(TrafficTokenHeader))
	}))
	defer upstream.Close()
	u, _ := url.Parse(upstream.URL)
	addr := netip.MustParseAddrPort(u.Host)
	port := u.Port()
	private := false
	res := fakeResolver{sbs: map[string]*sandbox.Sandbox{
		"ipub":  {ID: "ipub", IP: addr.Addr(), State: sandbox.StateRunning, Network: &sandbox.NetworkSpec{MaskRequestHost: "localhost:${PORT}"}},
		"ipriv": {ID: "ipriv", IP: addr.Addr(), State: sandbox.StateRunning, Network: &sandbox.NetworkSpec{AllowPublicTraffic: &private}},
	}}
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "api "+r.URL.Path) })
	g := New(res, slog.New(slog.DiscardHandler))
	g.SetOptions(Options{Domain: "sbx.example.com"})
	h := g.Handler(api)
	own := port + "-ipub.sbx.example.com"
	for _, tc := range []struct {
		name, host, path string
		headers          map[string]string
		code             int
		body             string
		want             map[string]string // response headers; "" = absent
		cookies          []string
	}{
		{name: "path form redirects to the port's own origin", host: "127.0.0.1:3000", path: "/sandboxes/ipub/ports/" + port + "/a%2Fb/c?q=1", code: 308,
			want: map[string]string{"Location": "http://" + port + "-ipub.sbx.example.com:3000/a%2Fb/c?q=1", "Content-Security-Policy": apiCSP}},
		{name: "path form without slash", host: "localhost:3000", path: "/sandboxes/ipub/ports/" + port, code: 308,
			want: map[string]string{"Location": "http://" + port + "-ipub.sbx.example.com:3000/"}},
		{name: "path form behind TLS", host: "api.example.com", path: "/sandboxes/ipub/ports/" + port + "/", headers: map[string]string{"X-Forwarded-Proto": "https"}, code: 308,
			want: map[string]string{"Location": "https://" + port + "-ipub.sbx.example.com/"}},
		{name: "path form of an unknown sandbox", host: "127.0.0.1:3000", path: "/sandboxes/inope/ports/80/", code: 308, body: "own origin"},
		{name: "api path", path: "/sandboxes/ipub", code: 200, body: "api /sandboxes/ipub",
			want: map[string]string{"Content-Security-Policy": apiCSP, "X-Frame-Options": "DENY", "Cross-Origin-Opener-Policy": "same-origin"}},
		{name: "host in domain", host: own, path: "/x", code: 200, body: "path=/x",
			want:    map[string]string{"Service-Worker-Allowed": "", "Clear-Site-Data": "", "Content-Security-Policy": "", "X-Frame-Options": ""},
			cookies: []string{"a=1; Path=/; HttpOnly", "b=2"}},
		{name: "host with the listener's port", host: own + ":3000", path: "/x", code: 200, body: "path=/x", cookies: []string{"a=1; Path=/; HttpOnly", "b=2"}},
		{name: "a port host never reaches the API", host: own, path: "/v2/sandboxes", code: 200, body: "path=/v2/sandboxes"},
		{name: "nor the dashboard", host: own, path: "/dashboard/", code: 200, body: "path=/dashboard/"},
		{name: "nor the path form", host: own, path: "/sandboxes/ipriv/ports/" + port + "/", code: 200, body: "path=/sandboxes/ipriv/ports/"},
		{name: "host outside domain", host: port + "-ipub.other.com", path: "/x", code: 200, body: "api /x"},
		{name: "host below a name under the domain", host: port + "-ipub.x.sbx.example.com", path: "/x", code: 200, body: "api /x"},
		{name: "headers route on the API's host: inert, no cookies", host: "127.0.0.1:3000", path: "/y", headers: map[string]string{"E2b-Sandbox-Id": "ipub", "E2b-Sandbox-Port": port}, code: 200, body: "path=/y",
			want: map[string]string{"Content-Security-Policy": sandboxCSP, "X-Content-Type-Options": "nosniff", "Service-Worker-Allowed": ""}, cookies: []string{}},
		{name: "private without token", host: port + "-ipriv.sbx.example.com", path: "/", code: 403},
		{name: "private wrong token", host: port + "-ipriv.sbx.example.com", path: "/", headers: map[string]string{TrafficTokenHeader: "traffic-ipub"}, code: 403},
		{name: "private with token", host: port + "-ipriv.sbx.example.com", path: "/", headers: map[string]string{TrafficTokenHeader: "traffic-ipriv"}, code: 200, body: "token= "},
		{name: "private envd port needs no token", headers: map[string]string{"E2b-Sandbox-Id": "ipriv", "E2b-Sandbox-Port": "49983"}, path: "/health", code: 502},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, tc.path, nil)
			if tc.host != "" {
				r.Host = tc.host
			}
			for k, v := range tc.headers {
				r.Header.Set(k, v)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			body := strings.TrimSpace(w.Body.String())
			if w.Code != tc.code || !strings.Contains(body+" ", tc.body) {
				t.Fatalf("%d %q, want %d %q", w.Code, body, tc.code, tc.body)
			}
			for k, want := range tc.want {
				if got := w.Header().Get(k); got != want {
					t.Errorf("%s = %q, want %q", k, got, want)
				}
			}
			if tc.cookies != nil {
				if got := w.Header().Values("Set-Cookie"); !slices.Equal(got, tc.cookies) && !(len(got) == 0 && len(tc.cookies) == 0) {
					t.Errorf("Set-Cookie %q, want %q", got, tc.cookies)
				}
			}
		})
	}

	t.Run("websocket through the port host", func(t *testing.T) {
		srv := httptest.NewServer(h)
		defer srv.Close()
		c, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: %s-ipub.sbx.example.com\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", port)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
			t.Fatalf("upgrade: %v %v", resp, err)
		}
		if v := resp.Header.Get("Service-Worker-Allowed"); v != "" {
			t.Errorf("upgrade answer kept Service-Worker-Allowed %q", v)
		}
		c.Write([]byte("hello"))
		got := make([]byte, 5)
		if _, err := io.ReadFull(br, got); err != nil || string(got) != "hello" {
			t.Fatalf("echo %q %v", got, err)
		}
	})
}

// Without a domain, <port>-<id>.localhost is the port's own origin: routed
// to the sandbox, never to the API, and where the path form redirects.
func TestIngressDefaultDomain(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Add("Set-Cookie", "a=1; Domain=localhost")
		fmt.Fprintf(w, "sandbox %s", r.URL.Path)
	}))
	defer upstream.Close()
	u, _ := url.Parse(upstream.URL)
	addr := netip.MustParseAddrPort(u.Host)
	port := u.Port()
	res := fakeResolver{sbs: map[string]*sandbox.Sandbox{"ipub": {ID: "ipub", IP: addr.Addr(), State: sandbox.StateRunning}}}
	g := New(res, slog.New(slog.DiscardHandler))
	h := g.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "api "+r.URL.Path) }))
	for _, tc := range []struct{ host, path, body, location, cookie string }{
		{host: port + "-ipub.localhost:3000", path: "/dashboard/", body: "sandbox /dashboard/", cookie: "a=1"},
		{host: port + "-IPUB.LOCALHOST:3000", path: "/v2/sandboxes", body: "sandbox /v2/sandboxes", cookie: "a=1"}, // host names ignore case
		{host: "127.0.0.1:3000", path: "/sandboxes/ipub/ports/" + port + "/x", location: "http://" + port + "-ipub.localhost:3000/x"},
		{host: "localhost:3000", path: "/dashboard/", body: "api /dashboard/"},
	} {
		r := httptest.NewRequest(http.MethodGet, tc.path, nil)
		r.Host = tc.host
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if !strings.Contains(w.Body.String(), tc.body) || w.Header().Get("Location") != tc.location || w.Header().Get("Set-Cookie") != tc.cookie {
			t.Errorf("%s%s: %d %q Location %q Set-Cookie %q, want %q %q %q", tc.host, tc.path, w.Code, w.Body.String(),
				w.Header().Get("Location"), w.Header().Get("Set-Cookie"), tc.body, tc.location, tc.cookie)
		}
	}
}

func TestPortOrigin(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
		host string
		tls  bool
		want string
	}{
		{"default domain keeps the listener's port", Options{}, "127.0.0.1:3000", false, "http://8000-iabc.localhost:3000/"},
		{"IPv6 listener", Options{}, "[::1]:3000", false, "http://8000-iabc.localhost:3000/"},
		{"domain, no port", Options{Domain: "sbx.example.com"}, "api.example.com", false, "http://8000-iabc.sbx.example.com/"},
		{"domain over TLS on 443", Options{Domain: "sbx.example.com"}, "api.example.com:443", true, "https://8000-iabc.sbx.example.com/"},
		{"domain and a TLS listener: https there", Options{Domain: "sbx.example.com", TLSPort: 8443}, "127.0.0.1:3000", false, "https://8000-iabc.sbx.example.com:8443/"},
		{"TLS listener without a domain: its certificate is not for localhost", Options{TLSPort: 443}, "127.0.0.1:3000", false, "http://8000-iabc.localhost:3000/"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := New(fakeResolver{}, slog.New(slog.DiscardHandler))
			g.SetOptions(tc.opts)
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			r.Host = tc.host
			if tc.tls {
				r.TLS = &tls.ConnectionState{}
			}
			if got := g.PortURL(r, "iabc", 8000); got != tc.want {
				t.Errorf("PortURL = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestHostOnlyCookie(t *testing.T) {
	for in, want := range map[string]string{
		"a=1":                                      "a=1",
		"a=1; Domain=localhost; Path=/":            "a=1; Path=/",
		"a=1;domain=.x.com;DOMAIN=y.com; Secure":   "a=1; Secure",
		"domain=1; Path=/":                         "domain=1; Path=/", // the cookie's own name stays
		"__Host-s=1; Secure; Path=/; Domain=x.com": "__Host-s=1; Secure; Path=/",
	} {
		if got := hostOnlyCookie(in); got != want {
			t.Errorf("hostOnlyCookie(%q) = %q, want %q", in, got, want)
		}
	}
}
