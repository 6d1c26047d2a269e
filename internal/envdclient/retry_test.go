package envdclient

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// TestInitRetriesLostAnswers: an /init whose answer is lost (the
// connection drops) is repeated; when the lost try took effect, envd holds
// the new token and the repeat proves it.
func TestInitRetriesLostAnswers(t *testing.T) {
	tests := []struct {
		name      string
		applyLost bool // the dropped try changed envd's token
		auth      string
	}{
		{"fresh envd, first answer lost before it applied", false, ""},
		{"fresh envd, first try applied but its answer was lost", true, ""},
		{"restored envd re-keyed, answer lost", true, "old-token"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			token, calls := tc.auth, 0
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				defer mu.Unlock()
				calls++
				var body Init
				_ = json.NewDecoder(r.Body).Decode(&body)
				if token != "" && r.Header.Get("X-Access-Token") != token {
					w.WriteHeader(http.StatusUnauthorized)
					return
				}
				if calls == 1 {
					if tc.applyLost {
						token = *body.AccessToken
					}
					c, _, _ := http.NewResponseController(w).Hijack()
					c.Close() // no answer
					return
				}
				token = *body.AccessToken
				w.WriteHeader(http.StatusNoContent)
			}))
			defer srv.Close()
			c := &Client{hc: srv.Client(), base: srv.URL}
			newToken := "new-token"
			if err := c.Init(context.Background(), Init{AccessToken: &newToken}, tc.auth); err != nil {
				t.Fatalf("Init: %v", err)
			}
			mu.Lock()
			defer mu.Unlock()
			if token != newToken || calls < 2 {
				t.Fatalf("envd token %q after %d calls, want %q after a retry", token, calls, newToken)
			}
		})
	}
	t.Run("an answer is not retried", func(t *testing.T) {
		calls := 0
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls++
			http.Error(w, "bad init", http.StatusBadRequest)
		}))
		defer srv.Close()
		c := &Client{hc: srv.Client(), base: srv.URL}
		if err := c.Init(context.Background(), Init{}, ""); err == nil || calls != 1 {
			t.Fatalf("Init = %v after %d calls, want the 400 after one", err, calls)
		}
	})
}

// TestWaitHealthyRetriesUnansweredAttempt: a health check whose first
// connection never gets an answer (a packet of a just-plugged veth lost)
// is tried again on a new connection well within the wait, instead of
// waiting out the whole per-call bound.
func TestWaitHealthyRetriesUnansweredAttempt(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	calls := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls++
		first := calls == 1
		mu.Unlock()
		if first {
			select { // never answered while the wait lasts
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	defer close(release) // before Close, which waits for the handler
	c := &Client{hc: srv.Client(), base: srv.URL}
	// Shorter than healthTimeout: one attempt bounded by it would fail.
	if err := c.WaitHealthy(context.Background(), healthTimeout/2); err != nil {
		t.Fatalf("WaitHealthy: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if calls < 2 {
		t.Fatalf("%d health calls, want a second after the unanswered one", calls)
	}
}
