package store

import (
	"context"
	"testing"
	"time"
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
	for _, stmt := range []string{`UPDATE audit SET action = 'x'`, `DELETE FROM audit`} {
		if _, err := s.db.ExecContext(ctx, stmt); err == nil {
			t.Errorf("%s succeeded on the append-only table", stmt)
		}
	}
	rows, err := s.QueryAudit(ctx, AuditFilter{})
	if err != nil || len(rows) != 1 || rows[0].Action != "create" || rows[0].Fields != "{}" {
		t.Fatalf("rows %+v, err %v", rows, err)
	}
}
