package gateway

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
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
			fmt.Fprint(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
			buf := make([]byte, 5)
			io.ReadFull(brw, buf)
			c.Write(buf)
			return
		}
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
	for _, tc := range []struct {
		name, host, path string
		headers          map[string]string
		code             int
		body             string
	}{
		{name: "path route", path: "/sandboxes/ipub/ports/" + port + "/a/b?q=1", code: 200, body: "path=/a/b prefix=/sandboxes/ipub/ports/" + port + " host=localhost:" + port},
		{name: "path route without slash", path: "/sandboxes/ipub/ports/" + port, code: 308},
		{name: "path route unknown sandbox", path: "/sandboxes/inope/ports/80/", code: 502},
		{name: "api path", path: "/sandboxes/ipub", code: 200, body: "api /sandboxes/ipub"},
		{name: "host in domain", host: port + "-ipub.sbx.example.com", path: "/x", code: 200, body: "path=/x"},
		{name: "host outside domain", host: port + "-ipub.other.com", path: "/x", code: 200, body: "api /x"},
		{name: "private without token", host: port + "-ipriv.sbx.example.com", path: "/", code: 403},
		{name: "private wrong token", path: "/sandboxes/ipriv/ports/" + port + "/", headers: map[string]string{TrafficTokenHeader: "traffic-ipub"}, code: 403},
		{name: "private with token", path: "/sandboxes/ipriv/ports/" + port + "/", headers: map[string]string{TrafficTokenHeader: "traffic-ipriv"}, code: 200, body: "token= "},
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
		})
	}

	t.Run("websocket through the path route", func(t *testing.T) {
		srv := httptest.NewServer(h)
		defer srv.Close()
		c, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "GET /sandboxes/ipub/ports/%s/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", port)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
			t.Fatalf("upgrade: %v %v", resp, err)
		}
		c.Write([]byte("hello"))
		got := make([]byte, 5)
		if _, err := io.ReadFull(br, got); err != nil || string(got) != "hello" {
			t.Fatalf("echo %q %v", got, err)
		}
	})
}
