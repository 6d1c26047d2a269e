package outside

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"
)

// TestWakeAttacks: the gateway judges credentials on a sandbox's record
// before it wakes the sandbox, so an outsider who knows a paused sandbox's
// id (ids show in port URLs) cannot resume it with made-up tokens: a
// resume costs the owner memory and restarts its timeout.
func TestWakeAttacks(t *testing.T) {
	s := server(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	st, b, err := s.Do(ctx, s.OtherKey, http.MethodPost, "/v2/sandboxes", map[string]any{
		"templateID": "base", "timeout": 300, "autoPause": true, "autoResume": map[string]any{"enabled": true},
		"network": map[string]any{"allowPublicTraffic": false},
	})
	if err != nil || st != http.StatusCreated {
		t.Fatalf("team B creates an auto-resuming sandbox: %d %s %v", st, b, err)
	}
	id := jsonField(t, b, "sandboxID")
	t.Cleanup(func() { _, _, _ = s.Do(context.Background(), s.OtherKey, http.MethodDelete, "/sandboxes/"+id, nil) })
	state := func() string {
		st, b, err := s.Do(ctx, s.OtherKey, http.MethodGet, "/sandboxes/"+id, nil)
		if err != nil || st != http.StatusOK {
			t.Fatalf("info: %d %s %v", st, b, err)
		}
		return jsonField(t, b, "state")
	}
	pause := func(t *testing.T) {
		if state() == "paused" {
			return
		}
		if st, b, err := s.Do(ctx, s.OtherKey, http.MethodPost, "/sandboxes/"+id+"/pause", nil); err != nil || st != http.StatusNoContent {
			t.Fatalf("pause: %d %s %v", st, b, err)
		}
	}
	knock := func(port int, hdr map[string]string) func(t *testing.T) error {
		return func(t *testing.T) error {
			pause(t)
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/envs", nil)
			req.Header.Set("E2b-Sandbox-Id", id)
			req.Header.Set("E2b-Sandbox-Port", fmt.Sprint(port))
			for k, v := range hdr {
				req.Header.Set(k, v)
			}
			code, _, err := send(from("127.0.0.1"), req)
			if err != nil {
				return err
			}
			if got := state(); got != "paused" {
				return crossed("answered %d and the sandbox is now %s", code, got)
			}
			return nil
		}
	}
	runAttacks(t, []attack{
		{side: sideOutsider, name: "wrong access token resumes a paused sandbox", run: knock(49983, map[string]string{"X-Access-Token": "guess"})},
		{side: sideOutsider, name: "no traffic token resumes a paused sandbox", run: knock(8080, nil)},
		{side: sideOutsider, name: "wrong traffic token resumes a paused sandbox", run: knock(8080, map[string]string{"E2b-Traffic-Access-Token": "guess"})},
	})
}
