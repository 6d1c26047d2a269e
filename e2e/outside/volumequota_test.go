package outside

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
	"github.com/agentbox/agentbox/internal/store"
)

// TestVolumeQuotaAttacks: a team that fills its volume quotas (how many,
// and how many MiB in all) is refused with an error naming the limit, and
// leaves another team's quota untouched.
func TestVolumeQuotaAttacks(t *testing.T) {
	s := harness.Start(t, harness.Name("volume-quota"),
		harness.Args("--max-volumes", "2", "--volume-size", "16", "--volume-max-size", "64", "--volume-team-max-total-size", "96"))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	keyA, keyB := s.NewKey(t, "quota-a"), s.NewKey(t, "quota-b")
	create := func(key, name string, sizeMB int) (int, string) {
		st, b, err := s.Do(ctx, key, http.MethodPost, "/volumes", map[string]any{"name": name, "sizeMB": sizeMB})
		if err != nil {
			t.Fatalf("create volume %s: %v", name, err)
		}
		if st/100 == 2 {
			id := jsonField(t, b, "volumeID")
			t.Cleanup(func() { _, _, _ = s.Do(context.Background(), key, http.MethodDelete, "/volumes/"+id, nil) })
		}
		return st, string(b)
	}
	// fill has team A hit one quota: creates that fit, then one past it,
	// which must be refused with a 4xx naming flag.
	fill := func(sizes []int, flag string) error {
		for i, mb := range sizes {
			st, b := create(keyA, fmt.Sprintf("a-%s-%d", strings.TrimPrefix(flag, "--"), i), mb)
			last := i == len(sizes)-1
			switch {
			case !last && st/100 != 2:
				return fmt.Errorf("create %d within the quota: %d %s", i, st, b)
			case last && st/100 == 2:
				return crossed("team A created past its quota (%s)", flag)
			case last && (st/100 != 4 || !strings.Contains(b, flag)):
				return fmt.Errorf("past the quota: %d %s, want a 4xx naming %s", st, b, flag)
			}
		}
		return nil
	}
	// teamB creates what its own quota allows, A's being full.
	teamB := func(sizes ...int) error {
		for i, mb := range sizes {
			if st, b := create(keyB, fmt.Sprintf("b-%d-%d", mb, i), mb); st/100 != 2 {
				return crossed("team A's full quota refused team B: %d %s", st, b)
			}
		}
		return nil
	}
	runAttacks(t, []attack{
		{sideTenant, "volume total-size quota: fill it, another team unaffected", func(t *testing.T) error {
			if err := fill([]int{64, 48}, "--volume-team-max-total-size"); err != nil {
				return err
			}
			return teamB(64)
		}},
		{sideTenant, "volume count quota: fill it, another team unaffected", func(t *testing.T) error {
			// Team A keeps its 64 MiB volume from the row above.
			if err := fill([]int{16, 16}, "--max-volumes"); err != nil {
				return err
			}
			return teamB(16)
		}},
	})

	// Creates, mounts and deletes of volumes are in the audit log, with
	// the team and key that made them.
	st, b, err := s.Do(ctx, keyA, http.MethodPost, "/sandboxes", map[string]any{"templateID": "base", "timeout": 120,
		"volumeMounts": []map[string]string{{"name": "a-volume-team-max-total-size-0", "path": "/data"}}})
	if err != nil || st != http.StatusCreated {
		t.Fatalf("create a sandbox mounting a volume: %d %s %v", st, b, err)
	}
	sbID := jsonField(t, b, "sandboxID")
	if st, b, err := s.Do(ctx, keyA, http.MethodDelete, "/sandboxes/"+sbID, nil); err != nil || st/100 != 2 {
		t.Fatalf("kill the sandbox: %d %s %v", st, b, err)
	}
	st, b, err = s.Do(ctx, keyA, http.MethodGet, "/volumes", nil)
	if err != nil || st != http.StatusOK {
		t.Fatalf("list volumes: %d %s %v", st, b, err)
	}
	var vols []struct{ VolumeID, Name string }
	if err := json.Unmarshal(b, &vols); err != nil {
		t.Fatal(err)
	}
	var delID string
	for _, v := range vols {
		if v.Name == "a-max-volumes-0" {
			delID = v.VolumeID
		}
	}
	if st, b, err := s.Do(ctx, keyA, http.MethodDelete, "/volumes/"+delID, nil); err != nil || st != http.StatusNoContent {
		t.Fatalf("delete volume %q: %d %s %v", delID, st, b, err)
	}
	db, err := store.Open(ctx, filepath.Join(s.DataDir, "agentbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.QueryAudit(ctx, store.AuditFilter{Kinds: []string{"lifecycle"}})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{} // action+name or id -> team
	for _, r := range rows {
		var f map[string]any
		_ = json.Unmarshal([]byte(r.Fields), &f)
		name, _ := f["name"].(string)
		id, _ := f["volumeID"].(string)
		seen[r.Action+" "+name+id] = r.TeamID
	}
	var teamA string
	for _, want := range []string{"volume-create a-volume-team-max-total-size-0", "volume-create b-64-0",
		"volume-mount a-volume-team-max-total-size-0", "volume-delete " + delID} {
		team, ok := seen[want]
		if !ok {
			for k := range seen {
				if strings.HasPrefix(k, want) {
					team, ok = seen[k], true
				}
			}
		}
		if !ok || team == "" {
			t.Errorf("no audit event %q with a team (events: %v)", want, seen)
		}
		if strings.Contains(want, " a-") {
			teamA = team
		}
	}
	if seen["volume-create b-64-0"] == teamA {
		t.Errorf("team B's volume create is recorded as team A's (%s)", teamA)
	}
}
