package gateway

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync"
	"testing"

	"github.com/agentbox/agentbox/internal/sandbox"
)

// sleepingResolver holds one paused sandbox and counts the wakes it did.
type sleepingResolver struct {
	fakeResolver
	mu    sync.Mutex
	wakes int
}

func (s *sleepingResolver) WakeIf(ctx context.Context, id string, check func(*sandbox.Sandbox) bool) (*sandbox.Sandbox, context.Context, func(), bool) {
	sb, ok := s.sbs[id]
	if !ok || (check != nil && !check(sb)) {
		return nil, nil, nil, false
	}
	s.mu.Lock()
	s.wakes++
	s.mu.Unlock()
	return sb, ctx, func() {}, true
}

// A request with a wrong credential is refused on the sandbox's record,
// before the sandbox is woken: guessing a paused sandbox's token never
// resumes it (which would cost its owner memory and start its timeout).
func TestWrongCredentialsNeverWake(t *testing.T) {
	closed := &sandbox.NetworkSpec{AllowPublicTraffic: new(bool)}
	res := &sleepingResolver{fakeResolver: fakeResolver{sbs: map[string]*sandbox.Sandbox{
		"isleep": {ID: "isleep", IP: netip.MustParseAddr("127.0.0.1"), Secure: true, State: sandbox.StatePaused, Network: closed},
	}}}
	h := New(res, slog.New(slog.DiscardHandler)).Handler(http.NotFoundHandler())
	for _, tc := range []struct {
		name    string
		port    string
		path    string
		headers map[string]string
		want    int
	}{
		{"wrong access token", "49983", "/envs", map[string]string{"X-Access-Token": "guess"}, http.StatusUnauthorized},
		{"wrong interpreter token", "49999", "/contexts", map[string]string{"X-Access-Token": "guess"}, http.StatusUnauthorized},
		{"no traffic token", "8080", "/", nil, http.StatusForbidden},
		{"wrong traffic token", "8080", "/", map[string]string{TrafficTokenHeader: "guess"}, http.StatusForbidden},
		{"internal envd route", "49983", "/init", map[string]string{"X-Access-Token": "tok-isleep"}, http.StatusNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", tc.path, nil)
			r.Header.Set("E2b-Sandbox-Id", "isleep")
			r.Header.Set("E2b-Sandbox-Port", tc.port)
			for k, v := range tc.headers {
				r.Header.Set(k, v)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != tc.want {
				t.Fatalf("status %d, want %d: %s", w.Code, tc.want, w.Body)
			}
			res.mu.Lock()
			defer res.mu.Unlock()
			if res.wakes != 0 {
				t.Fatalf("the sandbox was woken %d times by a refused request", res.wakes)
			}
		})
	}
}
