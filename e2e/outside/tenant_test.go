package outside

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"
)

// TestTenantAttacks: a key of another team tries every route that names a
// sandbox of team A. Each must answer exactly as for a sandbox that does not
// exist (404, same body), and leave the sandbox untouched.
func TestTenantAttacks(t *testing.T) {
	s := server(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	id := s.teamASandbox(ctx, t)
	const unknown = "i0000000000000000000"

	// stillRunning checks, as team A, that the sandbox survived an attack.
	stillRunning := func() error {
		st, b, err := s.Do(ctx, s.APIKey, http.MethodGet, "/sandboxes/"+id, nil)
		if err != nil {
			return err
		}
		if st != http.StatusOK {
			return crossed("team A's sandbox is gone after the attack: GET answers %d %s", st, b)
		}
		if state := jsonField(t, b, "state"); state != "running" {
			return crossed("team A's sandbox is %q after the attack", state)
		}
		return nil
	}
	routes := []struct {
		method, path string
		body         any
		header       http.Header
	}{
		{http.MethodGet, "/sandboxes/%s", nil, nil},
		{http.MethodGet, "/sandboxes/%s/metrics", nil, nil},
		{http.MethodGet, "/sandboxes/%s/logs", nil, nil},
		{http.MethodGet, "/v2/sandboxes/%s/logs", nil, nil},
		{http.MethodPost, "/sandboxes/%s/timeout", map[string]any{"timeout": 5}, nil},
		{http.MethodPost, "/sandboxes/%s/refreshes", map[string]any{"duration": 5}, nil},
		{http.MethodPost, "/sandboxes/%s/connect", map[string]any{"timeout": 60}, nil},
		{http.MethodPost, "/v2/sandboxes/%s/connect", map[string]any{"timeout": 60}, nil},
		{http.MethodPost, "/sandboxes/%s/resume", map[string]any{"timeout": 60}, nil},
		{http.MethodPost, "/sandboxes/%s/pause", nil, nil},
		{http.MethodPost, "/sandboxes/%s/snapshots", map[string]any{}, nil},
		{http.MethodPost, "/sandboxes/%s/fork", map[string]any{}, nil},
		{http.MethodPut, "/sandboxes/%s/network", map[string]any{}, nil},
		// With the upgrade headers, so that the route gets as far as the
		// sandbox lookup.
		{http.MethodGet, "/sandboxes/%s/tunnel/8080", nil, http.Header{"Connection": {"Upgrade"}, "Upgrade": {"agentbox-tcp"}}},
		{http.MethodDelete, "/sandboxes/%s", nil, nil},
	}
	var attacks []attack
	for _, r := range routes {
		attacks = append(attacks, attack{
			side: sideTenant,
			name: "other team " + r.method + " " + fmt.Sprintf(r.path, "{id}"),
			run: func(t *testing.T) error {
				st, b, err := s.DoHeader(ctx, s.OtherKey, r.method, fmt.Sprintf(r.path, id), r.body, r.header)
				if err != nil {
					return err
				}
				ust, ub, err := s.DoHeader(ctx, s.OtherKey, r.method, fmt.Sprintf(r.path, unknown), r.body, r.header)
				if err != nil {
					return err
				}
				switch {
				case st/100 == 2:
					return crossed("answered %d %.100s", st, b)
				case st != http.StatusNotFound:
					return crossed("answered %d (not 404): %.100s", st, b)
				case ust != st || !bytes.Equal(bytes.ReplaceAll(b, []byte(id), []byte(unknown)), ub):
					return crossed("existence oracle: %d %q for team A's sandbox, %d %q for none", st, b, ust, ub)
				}
				return stillRunning()
			},
		})
	}
	attacks = append(attacks, attack{
		side: sideTenant,
		name: "other team lists sandboxes",
		run: func(t *testing.T) error {
			for _, p := range []string{"/sandboxes", "/v2/sandboxes?state=running,paused"} {
				st, b, err := s.Do(ctx, s.OtherKey, http.MethodGet, p, nil)
				if err != nil {
					return err
				}
				if st != http.StatusOK {
					return fmt.Errorf("GET %s: %d %s", p, st, b)
				}
				if bytes.Contains(b, []byte(id)) {
					return crossed("GET %s lists team A's sandbox", p)
				}
			}
			return nil
		},
	})
	runAttacks(t, attacks)
}
