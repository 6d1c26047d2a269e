package gateway

import (
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/authlimit"
	"github.com/agentbox/agentbox/internal/envd"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// TestTokenGuessingIsThrottled guesses a sandbox's access token through the
// gateway against a real envd, and forges signed file URLs: past the burst
// the guessing address gets 429 with Retry-After, while another client with
// the right token is served and requests without any credential (health
// probes) are not counted.
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
			t.Fatalf("guess %d: %d, want envd's 401", i, w.Code)
		}
	}
	for _, tok := range []string{"guess", "tok-iguess"} {
		w := do(guesser, "/envs", tok)
		if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") == "" || !strings.Contains(w.Body.String(), "too many failed authentications") {
			t.Fatalf("past the burst: %d %q %s", w.Code, w.Header().Get("Retry-After"), w.Body)
		}
	}
	if w := do(owner, "/envs", "tok-iguess"); w.Code != http.StatusOK {
		t.Fatalf("the owner from another address: %d, want 200", w.Code)
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
