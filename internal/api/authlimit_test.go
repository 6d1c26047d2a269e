package api

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/authlimit"
	"github.com/agentbox/agentbox/internal/store"
)

// TestKeyGuessingIsThrottled guesses API keys from one address: after the
// burst that address's wrong keys get 429 with Retry-After and a reason,
// while a valid key is served as before, from another address and from
// the guesser's own (another team behind the same NAT, or MCP calling back
// over loopback). Requests without a key are not guesses and are not
// counted.
func TestKeyGuessingIsThrottled(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	team, _ := st.EnsureTeam(ctx, "a")
	key, _, _ := st.CreateAPIKey(ctx, team.ID, "")
	s := New(slog.New(slog.DiscardHandler), st, nil, nil)
	s.SetAuthLimiter(authlimit.New(authlimit.Options{Burst: 5}))
	h := s.Handler()
	do := func(from, k string) *httptest.ResponseRecorder {
		// A route that fails validation just after authentication.
		r := httptest.NewRequest(http.MethodGet, "/sandboxes?state=bogus", nil)
		r.RemoteAddr = from + ":5555"
		if k != "" {
			r.Header.Set("X-API-Key", k)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	const guesser, neighbour = "198.51.100.7", "198.51.100.8"
	for range 10 {
		if w := do(guesser, ""); w.Code != http.StatusUnauthorized {
			t.Fatalf("no key: %d", w.Code)
		}
	}
	for i := range 5 {
		if w := do(guesser, "e2b_"+strconv.Itoa(i)); w.Code != http.StatusUnauthorized {
			t.Fatalf("guess %d: %d, want 401", i, w.Code)
		}
	}
	for _, k := range []string{"e2b_6", "e2b_7"} {
		w := do(guesser, k)
		ra, _ := strconv.Atoi(w.Header().Get("Retry-After"))
		if w.Code != http.StatusTooManyRequests || ra < 1 || !strings.Contains(w.Body.String(), "too many failed authentications") {
			t.Fatalf("past the burst: %d Retry-After %q %s; want 429 with a reason", w.Code, w.Header().Get("Retry-After"), w.Body)
		}
	}
	for _, from := range []string{neighbour, guesser} {
		if w := do(from, key); w.Code != http.StatusBadRequest {
			t.Fatalf("a valid key from %s: %d, want it authenticated (400 for the bad query)", from, w.Code)
		}
	}
}
