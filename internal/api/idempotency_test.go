package api

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/store"
)

func TestCreateOnce(t *testing.T) {
	type body struct{ TemplateID string }
	s := &Server{}
	var made atomic.Int32
	release := make(chan struct{})
	create := func(fail bool) func() (any, error) {
		return func() (any, error) {
			<-release
			if fail {
				return nil, fmt.Errorf("no capacity: %w", errdefs.ErrUnavailable)
			}
			return map[string]string{"sandboxID": fmt.Sprint("i", made.Add(1))}, nil
		}
	}
	call := func(key string, b body, fail bool) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/sandboxes", nil)
		if key != "" {
			r.Header.Set(IdempotencyHeader, key)
		}
		w := httptest.NewRecorder()
		s.createOnce(w, r, b, create(fail))
		return w
	}
	close(release)

	t.Run("a retry gets the first sandbox", func(t *testing.T) {
		a, b := call("k1", body{"base"}, false), call("k1", body{"base"}, false)
		if a.Code != 201 || b.Code != 201 || a.Body.String() != b.Body.String() {
			t.Fatalf("first %d %s, retry %d %s", a.Code, a.Body, b.Code, b.Body)
		}
	})
	t.Run("another body with the key is a conflict", func(t *testing.T) {
		if w := call("k1", body{"other"}, false); w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), IdempotencyHeader) {
			t.Fatalf("%d %s, want 409 naming the header", w.Code, w.Body)
		}
	})
	t.Run("without a key every create is new", func(t *testing.T) {
		a, b := call("", body{"base"}, false), call("", body{"base"}, false)
		if a.Body.String() == b.Body.String() {
			t.Fatalf("two creates without a key gave one sandbox: %s", a.Body)
		}
	})
	t.Run("a failed create is forgotten", func(t *testing.T) {
		if w := call("k2", body{"base"}, true); w.Code != http.StatusServiceUnavailable {
			t.Fatalf("%d %s, want 503", w.Code, w.Body)
		}
		if w := call("k2", body{"base"}, false); w.Code != 201 {
			t.Fatalf("retry after a failure: %d %s", w.Code, w.Body)
		}
	})
	t.Run("another team's key of the same name is its own", func(t *testing.T) {
		// Another tenant guessing or reusing a key must not get this
		// team's sandbox (nor a 409 that tells the key is in use).
		mine := call("shared", body{"base"}, false)
		r := httptest.NewRequest(http.MethodPost, "/sandboxes", nil)
		r = r.WithContext(context.WithValue(r.Context(), ctxKey{}, store.APIKey{TeamID: "other-team"}))
		r.Header.Set(IdempotencyHeader, "shared")
		theirs := httptest.NewRecorder()
		s.createOnce(theirs, r, body{"base"}, create(false))
		if theirs.Code != 201 || theirs.Body.String() == mine.Body.String() {
			t.Fatalf("other team: %d %s; this team's answer %s", theirs.Code, theirs.Body, mine.Body)
		}
	})
	t.Run("a bad key is refused", func(t *testing.T) {
		if w := call(strings.Repeat("x", 300), body{"base"}, false); w.Code != http.StatusBadRequest {
			t.Fatalf("%d, want 400", w.Code)
		}
	})
}

func TestCreateOnceConcurrent(t *testing.T) {
	s := &Server{}
	var made atomic.Int32
	release := make(chan struct{})
	create := func() (any, error) {
		<-release
		return map[string]int32{"n": made.Add(1)}, nil
	}
	var wg sync.WaitGroup
	out := make([]string, 5)
	for i := range out {
		wg.Go(func() {
			r := httptest.NewRequest(http.MethodPost, "/sandboxes", nil)
			r.Header.Set(IdempotencyHeader, "same")
			w := httptest.NewRecorder()
			s.createOnce(w, r, "body", create)
			out[i] = w.Body.String()
		})
	}
	close(release)
	wg.Wait()
	if made.Load() != 1 {
		t.Fatalf("%d sandboxes made for one key", made.Load())
	}
	for _, o := range out[1:] {
		if o != out[0] {
			t.Fatalf("answers differ: %q vs %q", o, out[0])
		}
	}
}

// TestIdempotencyCachePerTeam: each team's keys live in a cache of their
// own with a cap of its own. A team that fills its cache forgets only its
// own oldest keys: another team's retry with its key still gets its first
// answer. A team whose every slot is a create under way is refused with
// the limit's flag.
func TestIdempotencyCachePerTeam(t *testing.T) {
	s := &Server{}
	s.SetIdempotencyKeysPerTeam(4)
	var made atomic.Int32
	create := func() (any, error) { return map[string]int32{"n": made.Add(1)}, nil }
	call := func(team, key string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/sandboxes", nil)
		r = r.WithContext(context.WithValue(r.Context(), ctxKey{}, store.APIKey{TeamID: team}))
		r.Header.Set(IdempotencyHeader, key)
		w := httptest.NewRecorder()
		s.createOnce(w, r, "body", create)
		return w
	}
	first := call("b", "b-key").Body.String()
	aFirst := call("a", "a-0").Body.String()
	for i := 1; i <= 100; i++ {
		if w := call("a", fmt.Sprint("a-", i)); w.Code != http.StatusCreated {
			t.Fatalf("team a's create %d: %d %s", i, w.Code, w.Body)
		}
	}
	for _, tc := range []struct {
		name, team, key, want string
		same                  bool
	}{
		{"another team's key survives", "b", "b-key", first, true},
		{"the filling team's newest key answers", "a", "a-100", "", false},
		{"the filling team's oldest key is forgotten", "a", "a-0", aFirst, false},
	} {
		got := call(tc.team, tc.key).Body.String()
		if tc.want != "" && (got == tc.want) != tc.same {
			t.Errorf("%s: answer %q, first answer %q", tc.name, got, tc.want)
		}
	}
	if n := s.idem.held("a"); n > 4 {
		t.Errorf("team a holds %d keys, cap 4", n)
	}
	if n := s.idem.held("b"); n != 1 {
		t.Errorf("team b holds %d keys, want its 1", n)
	}

	// Every slot under way: refused, naming the flag.
	hold := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			r := httptest.NewRequest(http.MethodPost, "/sandboxes", nil)
			r = r.WithContext(context.WithValue(r.Context(), ctxKey{}, store.APIKey{TeamID: "c"}))
			r.Header.Set(IdempotencyHeader, fmt.Sprint("c-", i))
			s.createOnce(httptest.NewRecorder(), r, "body", func() (any, error) { <-hold; return "ok", nil })
		})
	}
	for s.idem.held("c") < 4 {
		runtime.Gosched()
	}
	w := call("c", "c-late")
	close(hold)
	wg.Wait()
	if w.Code != http.StatusTooManyRequests || !strings.Contains(w.Body.String(), "--idempotency-keys-per-team") {
		t.Fatalf("past the cap with every create under way: %d %s, want 429 naming the flag", w.Code, w.Body)
	}
}
