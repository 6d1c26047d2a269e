package store

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// auditSchema is the append-only audit table. The triggers make the
// append-only promise hold for every writer of the database, not only for
// this package: rows can be added, never changed or removed.
const auditSchema = `
CREATE TABLE IF NOT EXISTS audit (
	seq INTEGER PRIMARY KEY AUTOINCREMENT,
	time INTEGER NOT NULL,
	sandbox_id TEXT NOT NULL,
	team_id TEXT NOT NULL,
	api_key_id TEXT NOT NULL,
	kind TEXT NOT NULL,
	action TEXT NOT NULL,
	decision TEXT NOT NULL,
	reason TEXT NOT NULL,
	fields TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_sandbox ON audit(sandbox_id, seq);
CREATE INDEX IF NOT EXISTS audit_team ON audit(team_id, seq);
CREATE TRIGGER IF NOT EXISTS audit_no_update BEFORE UPDATE ON audit
	BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
CREATE TRIGGER IF NOT EXISTS audit_no_delete BEFORE DELETE ON audit
	BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
`

// AuditRow is one stored audit event. Fields is JSON.
type AuditRow struct {
	Seq       int64
	Time      time.Time
	SandboxID string
	TeamID    string
	APIKeyID  string
	Kind      string
	Action    string
	Decision  string
	Reason    string
	Fields    string
}

// AuditFilter selects audit rows; zero fields match everything.
type AuditFilter struct {
	SandboxID string
	TeamID    string
	Kinds     []string
	Since     time.Time
	AfterSeq  int64
	Limit     int // newest Limit rows (returned oldest first); 0 = all
}

// InitAudit creates the audit table if it is missing. Open does not, so a
// server that never audits never grows the table.
func (s *Store) InitAudit(ctx context.Context) error {
	if _, err := s.db.ExecContext(ctx, auditSchema); err != nil {
		return fmt.Errorf("init audit table: %w", err)
	}
	return nil
}

// AppendAudit stores r and returns its sequence number.
func (s *Store) AppendAudit(ctx context.Context, r AuditRow) (int64, error) {
	if r.Fields == "" {
		r.Fields = "{}"
	}
	res, err := s.db.ExecContext(ctx, `INSERT INTO audit(time, sandbox_id, team_id, api_key_id, kind, action, decision, reason, fields)
		VALUES(?,?,?,?,?,?,?,?,?)`,
		r.Time.UnixNano(), r.SandboxID, r.TeamID, r.APIKeyID, r.Kind, r.Action, r.Decision, r.Reason, r.Fields)
	if err != nil {
		return 0, fmt.Errorf("append audit event: %w", err)
	}
	return res.LastInsertId()
}

// QueryAudit returns matching rows in the order they were appended.
func (s *Store) QueryAudit(ctx context.Context, f AuditFilter) ([]AuditRow, error) {
	var where []string
	var args []any
	if f.SandboxID != "" {
		where, args = append(where, "sandbox_id = ?"), append(args, f.SandboxID)
	}
	if f.TeamID != "" {
		where, args = append(where, "team_id = ?"), append(args, f.TeamID)
	}
	if len(f.Kinds) > 0 {
		where = append(where, "kind IN (?"+strings.Repeat(",?", len(f.Kinds)-1)+")")
		for _, k := range f.Kinds {
			args = append(args, k)
		}
	}
	if !f.Since.IsZero() {
		where, args = append(where, "time >= ?"), append(args, f.Since.UnixNano())
	}
	if f.AfterSeq > 0 {
		where, args = append(where, "seq > ?"), append(args, f.AfterSeq)
	}
	q := `SELECT seq, time, sandbox_id, team_id, api_key_id, kind, action, decision, reason, fields FROM audit`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY seq DESC"
	if f.Limit > 0 {
		q += fmt.Sprintf(" LIMIT %d", f.Limit)
	}
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("query audit log: %w", err)
	}
	defer rows.Close()
	var out []AuditRow
	for rows.Next() {
		var r AuditRow
		var ts int64
		if err := rows.Scan(&r.Seq, &ts, &r.SandboxID, &r.TeamID, &r.APIKeyID, &r.Kind, &r.Action, &r.Decision, &r.Reason, &r.Fields); err != nil {
			return nil, fmt.Errorf("query audit log: %w", err)
		}
		r.Time = time.Unix(0, ts)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("query audit log: %w", err)
	}
	// Newest-first made LIMIT keep the latest rows; callers read in order.
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out, nil
}
