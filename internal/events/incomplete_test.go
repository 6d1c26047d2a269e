package events

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/store"
)

// partStore answers ListEvents with bodies and err, as a store reading
// several places does when some cannot be read.
type partStore struct {
	*store.Store
	bodies []string
	err    error
}

func (p partStore) ListEvents(context.Context, store.EventFilter) ([]string, error) {
	return p.bodies, p.err
}

// TestIncompleteEvents: events a store could read are served with the
// header that says what is missing; any other error fails the request.
func TestIncompleteEvents(t *testing.T) {
	f := newFixture(t)
	for _, tc := range []struct {
		name       string
		bodies     []string
		err        error
		wantStatus int
		wantBody   string
		wantHeader string
	}{
		{name: "all read", bodies: []string{`{"id":"e1"}`}, wantStatus: http.StatusOK, wantBody: "[{\"id\":\"e1\"}]\n"},
		{name: "part read", bodies: []string{`{"id":"e1"}`}, err: &IncompleteError{Missing: "1 of 2 node agents not read (1 did not answer)"},
			wantStatus: http.StatusOK, wantBody: "[{\"id\":\"e1\"}]\n", wantHeader: "1 of 2 node agents not read (1 did not answer)"},
		{name: "part read, nothing there", bodies: []string{}, err: &IncompleteError{Missing: "1 of 2"},
			wantStatus: http.StatusOK, wantBody: "[]\n", wantHeader: "1 of 2"},
		{name: "none read", err: fmt.Errorf("no node agent could be read: %w", errdefs.ErrUnavailable), wantStatus: http.StatusServiceUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc, err := New(t.Context(), Config{}, partStore{Store: f.st, bodies: tc.bodies, err: tc.err}, f.log, nil, f.pol, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			mux := http.NewServeMux()
			for p, h := range svc.Routes(func(*http.Request) string { return "team-a" }) {
				mux.HandleFunc(p, h)
			}
			w := httptest.NewRecorder()
			mux.ServeHTTP(w, httptest.NewRequest("GET", "/events/sandboxes/s1", nil))
			if w.Code != tc.wantStatus {
				t.Fatalf("%d %s, want %d", w.Code, w.Body, tc.wantStatus)
			}
			if tc.wantBody != "" && w.Body.String() != tc.wantBody {
				t.Errorf("body %q, want %q", w.Body, tc.wantBody)
			}
			if got := w.Header().Get(IncompleteHeader); got != tc.wantHeader {
				t.Errorf("%s %q, want %q", IncompleteHeader, got, tc.wantHeader)
			}
		})
	}
}
