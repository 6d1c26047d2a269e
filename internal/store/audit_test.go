package store

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
)

func TestAuditAppendOnly(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	if err := s.InitAudit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.InitAudit(ctx); err != nil {
		t.Fatalf("second init: %v", err)
	}
	if _, err := s.AppendAudit(ctx, AuditRow{Time: time.Now(), SandboxID: "a", Kind: "lifecycle", Action: "create"}); err != nil {
		t.Fatal(err)
	}
	// Changes that do not go through PruneAudit. (A writer that may run
	// any SQL can also drop the triggers: that is why the database file is
	// private to the server, see Open.)
	for _, stmt := range []string{
		`UPDATE audit SET action = 'x'`,
		`DELETE FROM audit`,
		`DELETE FROM audit WHERE seq = 1`,
		`DELETE FROM audit_prune`,
	} {
		if _, err := s.db.ExecContext(ctx, stmt); err == nil {
			t.Errorf("%s succeeded on the append-only table", stmt)
		}
	}
	rows, err := s.QueryAudit(ctx, AuditFilter{})
	if err != nil || len(rows) != 1 || rows[0].Action != "create" || rows[0].Fields != "{}" {
		t.Fatalf("rows %+v, err %v", rows, err)
	}
}

// TestAuditUpgradeTrigger: a database made by a version whose delete
// trigger refused everything gets the retention-aware trigger.
func TestAuditUpgradeTrigger(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	if _, err := s.db.ExecContext(ctx, `CREATE TABLE audit (seq INTEGER PRIMARY KEY AUTOINCREMENT, time INTEGER NOT NULL,
		sandbox_id TEXT NOT NULL, team_id TEXT NOT NULL, api_key_id TEXT NOT NULL, kind TEXT NOT NULL, action TEXT NOT NULL,
		decision TEXT NOT NULL, reason TEXT NOT NULL, fields TEXT NOT NULL);
		CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;`); err != nil {
		t.Fatal(err)
	}
	if err := s.InitAudit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AppendAudit(ctx, AuditRow{Time: time.Now().Add(-time.Hour), SandboxID: "a", Kind: "egress", Action: "dns"}); err != nil {
		t.Fatal(err)
	}
	if n, err := s.PruneAudit(ctx, PruneFilter{Before: time.Now()}, 0); err != nil || n != 1 {
		t.Fatalf("prune after upgrade: %d rows, %v", n, err)
	}
}

func TestPruneAudit(t *testing.T) {
	ctx := context.Background()
	now := time.Now()
	fill := func(t *testing.T) *Store {
		s, _ := open(t)
		if err := s.InitAudit(ctx); err != nil {
			t.Fatal(err)
		}
		// 10 rows: sandbox a at -10h..-6h (seq 1-5), sandbox b at -5h..-1h (seq 6-10).
		for i := range 10 {
			sb := "a"
			if i >= 5 {
				sb = "b"
			}
			if _, err := s.AppendAudit(ctx, AuditRow{Time: now.Add(time.Duration(i-10) * time.Hour), SandboxID: sb, Kind: "egress", Action: fmt.Sprint(i + 1)}); err != nil {
				t.Fatal(err)
			}
		}
		return s
	}
	tests := []struct {
		name  string
		f     PruneFilter
		limit int
		left  []int64 // seqs remaining
	}{
		{"older than", PruneFilter{Before: now.Add(-7*time.Hour + time.Minute)}, 0, []int64{5, 6, 7, 8, 9, 10}},
		{"sandbox", PruneFilter{SandboxID: "b"}, 0, []int64{1, 2, 3, 4, 5}},
		{"sandbox and age", PruneFilter{SandboxID: "b", Before: now.Add(-3*time.Hour + time.Minute)}, 0, []int64{1, 2, 3, 4, 5, 9, 10}},
		{"keep newest", PruneFilter{KeepRows: 3}, 0, []int64{8, 9, 10}},
		{"keep more than there are", PruneFilter{KeepRows: 30}, 0, []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}},
		{"limit takes oldest", PruneFilter{Before: now}, 4, []int64{5, 6, 7, 8, 9, 10}},
		{"nothing matches", PruneFilter{SandboxID: "c"}, 0, []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := fill(t)
			n, err := s.PruneAudit(ctx, tc.f, tc.limit)
			if err != nil {
				t.Fatal(err)
			}
			rows, err := s.QueryAudit(ctx, AuditFilter{})
			if err != nil {
				t.Fatal(err)
			}
			var left []int64
			for _, r := range rows {
				left = append(left, r.Seq)
			}
			if fmt.Sprint(left) != fmt.Sprint(tc.left) || n != int64(10-len(tc.left)) {
				t.Errorf("removed %d, left %v; want left %v", n, left, tc.left)
			}
			// The guard is closed again: a plain delete still fails.
			if _, err := s.db.ExecContext(ctx, `DELETE FROM audit`); err == nil {
				t.Error("delete outside retention succeeded after a prune")
			}
			var guard int64
			if err := s.db.QueryRowContext(ctx, `SELECT max_seq FROM audit_prune`).Scan(&guard); err != nil || guard != 0 {
				t.Errorf("guard left at %d (%v)", guard, err)
			}
		})
	}
	s := fill(t)
	if _, err := s.PruneAudit(ctx, PruneFilter{}, 0); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("prune without a filter: %v, want invalid argument", err)
	}
}
