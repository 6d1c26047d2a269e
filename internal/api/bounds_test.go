package api

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/store"
)

// TestUploadLinksPerTeam: a team holds at most its cap of unused upload
// links; the next is refused naming the flag, another team is not, and
// links that expired or were used make room again.
func TestUploadLinksPerTeam(t *testing.T) {
	u := &uploadGrants{perTeam: 3}
	now := time.Unix(1000, 0)
	hash := strings.Repeat("a", 64)
	for _, tc := range []struct {
		name, team string
		at         time.Time
		refused    bool
	}{
		{"first", "a", now, false},
		{"second", "a", now, false},
		{"third", "a", now, false},
		{"past the cap", "a", now, true},
		{"another team", "b", now, false},
		{"once the first ones expired", "a", now.Add(uploadTokenTTL + time.Second), false},
	} {
		_, err := u.issue(tc.team, hash, false, tc.at)
		if tc.refused != (err != nil) {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if tc.refused && (!errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "--upload-links-per-team")) {
			t.Fatalf("%s: %v, want a quota error naming the flag", tc.name, err)
		}
	}
}

// TestMCPCallsPerTeam: a team has at most its cap of MCP requests under
// way; the next is refused with 429 naming the flag, while another team's
// call goes through; a call that ends frees its slot.
func TestMCPCallsPerTeam(t *testing.T) {
	c := &teamCalls{perTeam: 2}
	hold := make(chan struct{})
	inside := make(chan struct{}, 8)
	h := c.limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inside <- struct{}{}
		if r.Header.Get("Hold") != "" {
			<-hold
		}
	}))
	call := func(team string, holdIt bool) int {
		r := httptest.NewRequest(http.MethodPost, "/mcp", nil)
		r = r.WithContext(context.WithValue(r.Context(), ctxKey{}, store.APIKey{TeamID: team}))
		if holdIt {
			r.Header.Set("Hold", "1")
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code == http.StatusTooManyRequests && !strings.Contains(w.Body.String(), "--mcp-calls-per-team") {
			t.Errorf("refusal without the flag: %s", w.Body)
		}
		return w.Code
	}
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { call("a", true) })
		<-inside
	}
	for _, tc := range []struct {
		team string
		want int
	}{{"a", http.StatusTooManyRequests}, {"b", http.StatusOK}} {
		if got := call(tc.team, false); got != tc.want {
			t.Errorf("team %s with team a at its cap: %d, want %d", tc.team, got, tc.want)
		}
	}
	close(hold)
	wg.Wait()
	if got := call("a", false); got != http.StatusOK {
		t.Errorf("team a after its calls ended: %d", got)
	}
}
