package gateway

import (
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/agentbox/agentbox/internal/authlimit"
	"github.com/agentbox/agentbox/internal/envd"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// TestTokenGuessingIsThrottled guesses a sandbox's access token through the
// gateway against a real envd, and forges signed file URLs: past the burst
// the guessing address gets 429 with Retry-After for wrong credentials,
// while a right token is served from any address, the guesser's included
// (another team behind the same address), and requests without any
// credential (health probes) are not counted.
func TestTokenGuessingIsThrottled(t *testing.T) {
	// envd's fixed port on a loopback address of its own.
	ln, err := net.Listen("tcp4", "127.77.0.1:49983")
	if err != nil {
		t.Skipf("cannot listen on envd's port: %v", err)
	}
	e := envd.NewServer(envd.Options{Logger: slog.New(slog.DiscardHandler), LocalInit: true})
	srv := &http.Server{Handler: e.Handler()}
	go srv.Serve(ln)
	defer srv.Close()
	r0, err := http.Post("http://127.77.0.1:49983/init", "application/json", strings.NewReader(`{"accessToken":"tok-iguess"}`))
	if err != nil || r0.StatusCode != http.StatusNoContent {
		t.Fatalf("init: %v %v", err, r0)
	}
	r0.Body.Close()

	res := fakeResolver{sbs: map[string]*sandbox.Sandbox{"iguess": {ID: "iguess", IP: netip.MustParseAddr("127.77.0.1"), Secure: true, State: sandbox.StateRunning}}}
	g := New(res, slog.New(slog.DiscardHandler))
	g.SetAuthLimiter(authlimit.New(authlimit.Options{Burst: 5}))
	h := g.Handler(http.NotFoundHandler())
	do := func(from, path, token string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", path, nil)
		r.RemoteAddr = from + ":999"
		r.Header.Set("E2b-Sandbox-Id", "iguess")
		r.Header.Set("E2b-Sandbox-Port", "49983")
		if token != "" {
			r.Header.Set("X-Access-Token", token)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	const guesser, owner = "198.51.100.7", "198.51.100.8"
	for range 10 {
		if w := do(guesser, "/health", ""); w.Code != http.StatusNoContent {
			t.Fatalf("health probe: %d", w.Code)
		}
	}
	for i := range 5 {
		if w := do(guesser, "/envs", "guess"); w.Code != http.StatusUnauthorized {
			t.Fatalf("guess %d: %d, want 401", i, w.Code)
		}
	}
	w := do(guesser, "/envs", "guess")
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") == "" || !strings.Contains(w.Body.String(), "too many failed authentications") {
		t.Fatalf("past the burst: %d %q %s", w.Code, w.Header().Get("Retry-After"), w.Body)
	}
	for _, from := range []string{owner, guesser} {
		if w := do(from, "/envs", "tok-iguess"); w.Code != http.StatusOK {
			t.Fatalf("the right token from %s: %d, want 200", from, w.Code)
		}
	}

	// Forged signed URLs, from a third address.
	forge := func() int {
		r := httptest.NewRequest("GET", "/files?path=x&signature=v1_forged", nil)
		r.RemoteAddr = "198.51.100.9:1"
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	for i := range 5 {
		if c := forge(); c != http.StatusUnauthorized {
			t.Fatalf("forgery %d: %d, want 401", i, c)
		}
	}
	if c := forge(); c != http.StatusTooManyRequests {
		t.Fatalf("forgery past the burst: %d, want 429", c)
	}
}

// TestSandboxAnswersAreNotGuesses: code in a sandbox decides what its
// ports answer, envd's and the interpreter's included (it is root there).
// However many 401s and 403s a sandbox gives a caller, they never count
// against the caller's address: the caller's credentials stay served.
func TestSandboxAnswersAreNotGuesses(t *testing.T) {
	// A hostile sandbox: an app port and a fake envd answer every request
	// with the status the row sets.
	var status atomic.Int32
	hostile := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(int(status.Load())) })
	app, err := net.Listen("tcp4", "127.77.0.3:0")
	if err != nil {
		t.Skipf("cannot listen on 127.77.0.3: %v", err)
	}
	fakeEnvd, err := net.Listen("tcp4", "127.77.0.3:49983")
	if err != nil {
		t.Skipf("cannot listen on envd's port: %v", err)
	}
	for _, ln := range []net.Listener{app, fakeEnvd} {
		srv := &http.Server{Handler: hostile}
		go srv.Serve(ln)
		defer srv.Close()
	}
	appPort := app.Addr().(*net.TCPAddr).Port
	for _, tc := range []struct {
		name    string
		port    int
		status  int
		headers map[string]string
	}{
		{name: "envd's port answers 401 to the right token", port: sandbox.EnvdPort, status: http.StatusUnauthorized,
			headers: map[string]string{"X-Access-Token": "tok-ihostile"}},
		{name: "an app port answers 401 to an access token", port: appPort, status: http.StatusUnauthorized,
			headers: map[string]string{"X-Access-Token": "anything"}},
		{name: "an app port answers 401 to a bearer key", port: appPort, status: http.StatusUnauthorized,
			headers: map[string]string{"Authorization": "Bearer e2b_x"}},
		{name: "an app port answers 403", port: appPort, status: http.StatusForbidden},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status.Store(int32(tc.status))
			res := fakeResolver{sbs: map[string]*sandbox.Sandbox{"ihostile": {ID: "ihostile", IP: netip.MustParseAddr("127.77.0.3"), Secure: true, State: sandbox.StateRunning}}}
			lim := authlimit.New(authlimit.Options{Burst: 3})
			g := New(res, slog.New(slog.DiscardHandler))
			g.SetAuthLimiter(lim)
			h := g.Handler(http.NotFoundHandler())
			const caller = "198.51.100.20"
			for i := range 20 {
				r := httptest.NewRequest("GET", "/x", nil)
				r.RemoteAddr = caller + ":1"
				r.Header.Set("E2b-Sandbox-Id", "ihostile")
				r.Header.Set("E2b-Sandbox-Port", strconv.Itoa(tc.port))
				for k, v := range tc.headers {
					r.Header.Set(k, v)
				}
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				if w.Code != tc.status {
					t.Fatalf("request %d: %d, want the sandbox's %d %s", i, w.Code, tc.status, w.Body)
				}
			}
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = caller + ":1"
			if lim.Throttled(lim.Client(r)) {
				t.Fatal("the sandbox's answers were counted as the caller's failed authentications")
			}
		})
	}
}
