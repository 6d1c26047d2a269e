package outside

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"
)

// TestPoolStatsPerTeam: GET /pools is what one team may see of a warm pool
// every team shares. Team B's create of the pooled template (a claim or a
// miss) must not change what team A reads, or A learns when B works.
func TestPoolStatsPerTeam(t *testing.T) {
	s := server(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s.Restart(t, "--pool", "base=1")
	t.Cleanup(func() { s.Restart(t) }) // the rest of the suite runs without a pool

	pools := func(key string) ([]byte, []map[string]any, error) {
		st, b, err := s.Do(ctx, key, http.MethodGet, "/pools", nil)
		if err != nil {
			return nil, nil, err
		}
		if st != http.StatusOK {
			return nil, nil, fmt.Errorf("GET /pools: %d %s", st, b)
		}
		var out []map[string]any
		if err := json.Unmarshal(b, &out); err != nil {
			return nil, nil, fmt.Errorf("GET /pools: %w: %.200s", err, b)
		}
		return b, out, nil
	}
	runAttacks(t, []attack{{
		side: sideTenant,
		name: "other team's pool claims in GET /pools",
		run: func(t *testing.T) error {
			// The pool is resolved at the reaper's next tick.
			var before []byte
			for {
				b, list, err := pools(s.APIKey)
				if err != nil {
					return err
				}
				if len(list) > 0 {
					before = b
					break
				}
				select {
				case <-ctx.Done():
					return fmt.Errorf("the base pool never appeared in GET /pools: %s", b)
				case <-time.After(200 * time.Millisecond):
				}
			}
			st, b, err := s.Do(ctx, s.OtherKey, http.MethodPost, "/v2/sandboxes", map[string]any{"templateID": "base", "timeout": 120})
			if err != nil || st != http.StatusCreated {
				return fmt.Errorf("team B creates a sandbox: %d %s %v", st, b, err)
			}
			id := jsonField(t, b, "sandboxID")
			defer func() { _, _, _ = s.Do(context.Background(), s.OtherKey, http.MethodDelete, "/sandboxes/"+id, nil) }()
			// B sees its own create counted: the row is live.
			_, mine, err := pools(s.OtherKey)
			if err != nil {
				return err
			}
			hits, _ := mine[0]["hits"].(float64)
			misses, _ := mine[0]["misses"].(float64)
			if hits+misses != 1 {
				return fmt.Errorf("team B's own view does not count its create: %v", mine)
			}
			after, _, err := pools(s.APIKey)
			if err != nil {
				return err
			}
			if !bytes.Equal(before, after) {
				return crossed("team A's GET /pools changed with team B's create: %s then %s", before, after)
			}
			return nil
		},
	}})
}
