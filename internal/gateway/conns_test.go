package gateway

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/agentbox/agentbox/internal/sandbox"
)

// TestConnectionLimits: requests under way are counted per client address
// and per sandbox; past either bound the gateway refuses with a message
// naming the flag (429 for a client, 503 for a sandbox), other clients and
// sandboxes are unaffected, and a request that ends frees its place.
func TestConnectionLimits(t *testing.T) {
	hold := make(chan struct{})
	arrived := make(chan struct{}, 16)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		if r.URL.Path == "/hold" {
			<-hold
		}
	}))
	defer upstream.Close()
	addr := netip.MustParseAddrPort(strings.TrimPrefix(upstream.URL, "http://"))
	res := fakeResolver{sbs: map[string]*sandbox.Sandbox{
		"ione": {ID: "ione", IP: addr.Addr(), State: sandbox.StateRunning},
		"itwo": {ID: "itwo", IP: addr.Addr(), State: sandbox.StateRunning},
	}}
	g := New(res, slog.New(slog.DiscardHandler))
	g.SetLimits(Limits{PerClient: 2, PerSandbox: 3})
	h := g.Handler(http.NotFoundHandler())
	do := func(from, id, path string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", path, nil)
		r.RemoteAddr = from + ":1"
		r.Header.Set("E2b-Sandbox-Id", id)
		r.Header.Set("E2b-Sandbox-Port", strconv.Itoa(int(addr.Port())))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	var wg sync.WaitGroup
	holdFrom := func(from, id string) {
		wg.Go(func() { do(from, id, "/hold") })
		<-arrived
	}
	// Client a holds 2 (its bound) on ione; client b holds 1 there: ione
	// is at its bound of 3.
	holdFrom("198.51.100.1", "ione")
	holdFrom("198.51.100.1", "ione")
	holdFrom("198.51.100.2", "ione")
	for _, tc := range []struct {
		name, from, id string
		code           int
		flag           string
	}{
		{"client a past its bound", "198.51.100.1", "itwo", http.StatusTooManyRequests, "--gateway-max-per-client"},
		{"client c to the full sandbox", "198.51.100.3", "ione", http.StatusServiceUnavailable, "--gateway-max-per-sandbox"},
		{"client c to another sandbox", "198.51.100.3", "itwo", http.StatusOK, ""},
	} {
		w := do(tc.from, tc.id, "/")
		if w.Code != tc.code || !strings.Contains(w.Body.String(), tc.flag) {
			t.Errorf("%s: %d %s, want %d naming %q", tc.name, w.Code, w.Body, tc.code, tc.flag)
		}
		if w.Code == http.StatusOK {
			<-arrived
		}
	}
	close(hold)
	wg.Wait()
	if w := do("198.51.100.1", "ione", "/"); w.Code != http.StatusOK {
		t.Errorf("after the held requests ended: %d %s", w.Code, w.Body)
	}
}
