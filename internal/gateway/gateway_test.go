package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/agentbox/agentbox/internal/sandbox"
)

// The static vector of the E2B SDK's own tests.
func TestSignatureVector(t *testing.T) {
	got := Signature("hello.txt", "read", "user", "0tQG31xiMp0IOQfaz9dcwi72L1CPo8e0", "")
	if want := "v1_gUtH/s9YCJWgCizjfUxuWfhFE4QSydOWEIIvfLwDr6E"; got != want {
		t.Fatalf("Signature = %s, want %s", got, want)
	}
}

func TestRoute(t *testing.T) {
	tests := []struct {
		name    string
		host    string
		headers map[string]string
		id      string
		port    int
		routed  bool
		errMsg  string
	}{
		{name: "api", host: "127.0.0.1:3000"},
		{name: "headers", host: "127.0.0.1:3000", headers: map[string]string{"E2b-Sandbox-Id": "iabc", "E2b-Sandbox-Port": "49983"}, id: "iabc", port: 49983, routed: true},
		{name: "missing port", host: "localhost", headers: map[string]string{"E2b-Sandbox-Id": "iabc"}, errMsg: "missing header E2b-Sandbox-Port"},
		{name: "missing id", host: "localhost", headers: map[string]string{"E2b-Sandbox-Port": "1"}, errMsg: "missing header E2b-Sandbox-Id"},
		{name: "bad id", host: "localhost", headers: map[string]string{"E2b-Sandbox-Id": "../x", "E2b-Sandbox-Port": "1"}, errMsg: "Invalid sandbox ID"},
		{name: "bad port", host: "localhost", headers: map[string]string{"E2b-Sandbox-Id": "iabc", "E2b-Sandbox-Port": "70000"}, errMsg: "Invalid sandbox port"},
		{name: "host route", host: "8080-iabc.localhost:3000", id: "iabc", port: 8080, routed: true},
		{name: "host route bad port", host: "99999-iabc.example.com", errMsg: "Invalid sandbox port"},
		{name: "plain subdomain", host: "api.example.com"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "/health", nil)
			r.Host = tc.host
			for k, v := range tc.headers {
				r.Header.Set(k, v)
			}
			id, port, routed, errMsg := Route(r)
			if id != tc.id || port != tc.port || routed != tc.routed || errMsg != tc.errMsg {
				t.Fatalf("route = %q %d %v %q", id, port, routed, errMsg)
			}
		})
	}
}

type fakeResolver struct{ sbs map[string]*sandbox.Sandbox }

func (f fakeResolver) Lookup(id string) (*sandbox.Sandbox, bool) { sb, ok := f.sbs[id]; return sb, ok }
func (f fakeResolver) Token(id string) string                    { return "tok-" + id }
func (f fakeResolver) TrafficToken(id string) string             { return "traffic-" + id }
func (f fakeResolver) Running() []*sandbox.Sandbox {
	var out []*sandbox.Sandbox
	for _, sb := range f.sbs {
		out = append(out, sb)
	}
	return out
}

// A real upstream stands in for envd: the gateway must route by header and by
// signature, hide /init, and answer unknown sandboxes with E2B's 502.
func TestProxy(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("envd:" + r.URL.Path + ":" + r.Header.Get("X-Access-Token")))
	}))
	defer upstream.Close()
	u, _ := url.Parse(upstream.URL)
	addr := netip.MustParseAddrPort(u.Host)
	// The gateway dials <ip>:<port>; point the sandbox's port at the upstream.
	res := fakeResolver{sbs: map[string]*sandbox.Sandbox{"iabc": {ID: "iabc", IP: addr.Addr(), Secure: true, State: sandbox.StateRunning}}}
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("api")) })
	h := New(res, slog.New(slog.DiscardHandler)).Handler(api)
	port := u.Port()
	do := func(method, target string, headers map[string]string) (int, string) {
		r := httptest.NewRequest(method, target, nil)
		for k, v := range headers {
			r.Header.Set(k, v)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code, w.Body.String()
	}
	if code, body := do("GET", "/health", nil); code != 200 || body != "api" {
		t.Fatalf("api: %d %s", code, body)
	}
	hdr := map[string]string{"E2b-Sandbox-Id": "iabc", "E2b-Sandbox-Port": port, "X-Access-Token": "t"}
	if code, body := do("GET", "/health", hdr); code != 200 || body != "envd:/health:t" {
		t.Fatalf("proxied: %d %s", code, body)
	}
	code, body := do("GET", "/health", map[string]string{"E2b-Sandbox-Id": "inope", "E2b-Sandbox-Port": port})
	var e map[string]any
	json.Unmarshal([]byte(body), &e)
	if code != 502 || e["sandboxId"] != "inope" || e["message"] != "The sandbox was not found" {
		t.Fatalf("unknown sandbox: %d %s", code, body)
	}
	if code, _ := do("POST", "/init", map[string]string{"E2b-Sandbox-Id": "iabc", "E2b-Sandbox-Port": "49983"}); code != 404 {
		t.Fatalf("/init through the gateway: %d, want 404", code)
	}
	sig := Signature("x.txt", "read", "user", "tok-iabc", "")
	// Signature routing always targets envd's port, which the test upstream
	// does not listen on: a 502 "port is not open" proves it was routed.
	code, body = do("GET", "/files?path=x.txt&username=user&signature="+url.QueryEscape(sig), nil)
	if code != 502 || !strings.Contains(body, "port is not open") {
		t.Fatalf("signed: %d %s", code, body)
	}
	if code, _ := do("GET", "/files?path=x.txt&username=user&signature=v1_forged", nil); code != 401 {
		t.Fatalf("forged signature: %d, want 401", code)
	}
}

// TestUnreadBodyOnKeptAliveConnection: requests with a body to a port
// nothing listens on (answered 502 without forwarding the body) must not
// break the kept-alive connection with a panic on the next request.
func TestUnreadBodyOnKeptAliveConnection(t *testing.T) {
	closed, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := closed.Addr().(*net.TCPAddr).Port
	closed.Close() // nothing listens there now
	res := fakeResolver{sbs: map[string]*sandbox.Sandbox{"iabc": {ID: "iabc", IP: netip.MustParseAddr("127.0.0.1"), State: sandbox.StateRunning}}}
	srv := httptest.NewUnstartedServer(New(res, slog.New(slog.DiscardHandler)).Handler(http.NotFoundHandler()))
	var errs bytes.Buffer
	var mu sync.Mutex
	srv.Config.ErrorLog = log.New(lockedWriter{&mu, &errs}, "", 0)
	srv.Start()
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1}}
	for i := range 20 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/execute", strings.NewReader(`{"code":"1"}`))
		req.Header.Set("E2b-Sandbox-Id", "iabc")
		req.Header.Set("E2b-Sandbox-Port", strconv.Itoa(port))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadGateway {
			t.Fatalf("request %d: %d, want 502", i, resp.StatusCode)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Contains(errs.String(), "panic") {
		t.Fatalf("server panicked:\n%.600s", errs.String())
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// wakeResolver is a resolver whose traffic runs under a context the test
// ends, as the manager's removal of a sandbox does (Manager.Wake).
type wakeResolver struct {
	fakeResolver
	mu   sync.Mutex
	gone bool
	live context.Context
}

func (w *wakeResolver) Lookup(id string) (*sandbox.Sandbox, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.gone {
		return nil, false
	}
	return w.fakeResolver.Lookup(id)
}

func (w *wakeResolver) WakeIf(ctx context.Context, id string, check func(*sandbox.Sandbox) bool) (*sandbox.Sandbox, context.Context, func(), bool) {
	sb, ok := w.Lookup(id)
	if !ok || (check != nil && !check(sb)) {
		return nil, nil, nil, false
	}
	live, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(w.live, cancel)
	return sb, live, func() { stop(); cancel() }, true
}

// A request waiting on a sandbox that is killed meanwhile is answered with
// E2B's "sandbox not found" 502, not an empty 200.
func TestRequestToKilledSandbox(t *testing.T) {
	started := make(chan struct{})
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-r.Context().Done() // never answers
	}))
	defer upstream.Close()
	addr := netip.MustParseAddrPort(strings.TrimPrefix(upstream.URL, "http://"))
	live, kill := context.WithCancel(context.Background())
	res := &wakeResolver{fakeResolver: fakeResolver{sbs: map[string]*sandbox.Sandbox{"iabc": {ID: "iabc", IP: addr.Addr(), State: sandbox.StateRunning}}}, live: live}
	h := New(res, slog.New(slog.DiscardHandler)).Handler(http.NotFoundHandler())
	go func() {
		<-started
		res.mu.Lock()
		res.gone = true
		res.mu.Unlock()
		kill()
	}()
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("E2b-Sandbox-Id", "iabc")
	r.Header.Set("E2b-Sandbox-Port", strconv.Itoa(int(addr.Port())))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusBadGateway || !strings.Contains(w.Body.String(), "The sandbox was not found") {
		t.Fatalf("request to a sandbox killed under it: %d %q, want 502 sandbox not found", w.Code, w.Body.String())
	}
}
