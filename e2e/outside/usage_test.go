package outside

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestUsageAttacks: another team's key reads team A's metered usage by
// team id, looks for A's sandboxes in its own usage, and sends malformed
// windows. Another team's id answers as an unknown one; bad from/to are
// refused naming the field.
func TestUsageAttacks(t *testing.T) {
	s := server(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	id := s.teamASandbox(ctx, t)

	type reply struct {
		TeamID    string `json:"teamID"`
		Sandboxes []struct {
			SandboxID string `json:"sandboxID"`
		} `json:"sandboxes"`
	}
	usage := func(key, path string) (int, []byte, reply) {
		t.Helper()
		st, b, err := s.Do(ctx, key, http.MethodGet, path, nil)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		var r reply
		if st == http.StatusOK {
			if err := json.Unmarshal(b, &r); err != nil {
				t.Fatalf("GET %s: %s: %v", path, b, err)
			}
		}
		return st, b, r
	}
	lists := func(r reply) bool {
		for _, sb := range r.Sandboxes {
			if sb.SandboxID == id {
				return true
			}
		}
		return false
	}
	// Wait until A's own usage lists the sandbox (the meter samples every
	// few seconds), so the attacks below have something to find.
	var teamA string
	for i := 0; ; i++ {
		_, _, r := usage(s.APIKey, "/usage")
		teamA = r.TeamID
		if lists(r) {
			break
		}
		if i == 60 {
			t.Fatalf("team A's usage never listed its sandbox %s", id)
		}
		time.Sleep(time.Second)
	}
	_, _, mine := usage(s.OtherKey, "/usage")
	teamB := mine.TeamID
	if teamA == "" || teamB == "" || teamA == teamB {
		t.Fatalf("team ids %q and %q", teamA, teamB)
	}

	refusedNaming := func(path, field string) func(*testing.T) error {
		return func(t *testing.T) error {
			st, b, _ := usage(s.OtherKey, path)
			if st/100 == 2 {
				return crossed("answered %d %.100s", st, b)
			}
			if st != http.StatusBadRequest || !strings.Contains(string(b), field+":") {
				return crossed("answered %d %.200s; want 400 naming %s", st, b, field)
			}
			return nil
		}
	}
	runAttacks(t, []attack{
		{side: sideTenant, name: "other team GET /teams/{A's id}/usage", run: func(t *testing.T) error {
			st, b, r := usage(s.OtherKey, "/teams/"+teamA+"/usage")
			ust, ub, _ := usage(s.OtherKey, "/teams/t0000000000000000000/usage")
			switch {
			case st/100 == 2:
				return crossed("answered %d with team %s's usage (lists A's sandbox: %v)", st, r.TeamID, lists(r))
			case st != http.StatusNotFound || string(b) != strings.ReplaceAll(string(ub), "t0000000000000000000", teamA) || ust != st:
				return crossed("answers %d %.100s, unlike an unknown team (%d %.100s)", st, b, ust, ub)
			}
			return nil
		}},
		{side: sideTenant, name: "other team finds A's sandbox in its own GET /usage", run: func(t *testing.T) error {
			for _, path := range []string{"/usage", "/teams/" + teamB + "/usage", "/usage?from=2000-01-01T00:00:00Z"} {
				st, b, r := usage(s.OtherKey, path)
				if st != http.StatusOK {
					return crossed("GET %s: %d %.100s", path, st, b)
				}
				if r.TeamID != teamB || lists(r) {
					return crossed("GET %s: team %s, lists A's sandbox: %v", path, r.TeamID, lists(r))
				}
			}
			return nil
		}},
		{side: sideTenant, name: "GET /usage with a malformed from", run: refusedNaming("/usage?from=last-week", "from")},
		{side: sideTenant, name: "GET /usage with a malformed to", run: refusedNaming("/usage?to=1700000000", "to")},
		{side: sideTenant, name: "GET /usage with from after to", run: refusedNaming("/usage?from=2026-02-01T00:00:00Z&to=2026-01-01T00:00:00Z", "from")},
	})
}
