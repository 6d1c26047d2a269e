package store

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// auditSchema is the append-only audit table. The triggers make the
// append-only promise hold for every writer of the database, not only for
// this package: rows can be added, never changed, and removed only by
// retention (PruneAudit). A delete passes only while audit_prune names a
// sequence number at or above the row's, which PruneAudit sets inside its
// own transaction and clears before committing; no other code path writes
// that table, and everything a sandbox causes only ever inserts.
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
CREATE TABLE IF NOT EXISTS audit_prune (
	id INTEGER PRIMARY KEY CHECK (id = 1),
	max_seq INTEGER NOT NULL -- rows up to this seq may be deleted; 0: none
);
INSERT OR IGNORE INTO audit_prune(id, max_seq) VALUES(1, 0);
DROP TRIGGER IF EXISTS audit_no_delete;
CREATE TRIGGER IF NOT EXISTS audit_delete_only_retention BEFORE DELETE ON audit
	WHEN OLD.seq > (SELECT max_seq FROM audit_prune WHERE id = 1)
	BEGIN SELECT RAISE(ABORT, 'the audit log is append-only; rows are removed only by retention (agentbox audit prune)'); END;
CREATE TRIGGER IF NOT EXISTS audit_prune_one_row BEFORE DELETE ON audit_prune
	BEGIN SELECT RAISE(ABORT, 'audit_prune keeps its one row'); END;
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
	out, err := scanAuditRows(rows)
	if err != nil {
		return nil, fmt.Errorf("query audit log: %w", err)
	}
	// Newest-first made LIMIT keep the latest rows; callers read in order.
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out, nil
}

// PruneFilter selects the audit rows retention removes: rows matching every
// set field. At least one field must be set.
type PruneFilter struct {
	Before    time.Time // rows older than this
	SandboxID string    // rows of this sandbox
	KeepRows  int64     // everything but the newest KeepRows rows
}

func (f PruneFilter) where() (string, []any) {
	var where []string
	var args []any
	if !f.Before.IsZero() {
		where, args = append(where, "time < ?"), append(args, f.Before.UnixNano())
	}
	if f.SandboxID != "" {
		where, args = append(where, "sandbox_id = ?"), append(args, f.SandboxID)
	}
	if f.KeepRows > 0 {
		// The (KeepRows+1)-th newest row and everything before it; seq
		// has gaps after a prune by sandbox, so no arithmetic on it.
		where, args = append(where, "seq <= (SELECT seq FROM audit ORDER BY seq DESC LIMIT 1 OFFSET ?)"), append(args, f.KeepRows)
	}
	return strings.Join(where, " AND "), args
}

// PruneAudit deletes the rows f selects, oldest first, at most limit of them
// (0: all), and returns how many it removed. It is the only delete path the
// table's triggers let through: it opens the guard up to the highest
// sequence number it means to delete and closes it again in the same
// transaction, so the guard is never open outside it.
func (s *Store) PruneAudit(ctx context.Context, f PruneFilter, limit int) (int64, error) {
	where, args := f.where()
	if where == "" {
		return 0, fmt.Errorf("audit prune: no filter (age, sandbox or row cap): %w", errdefs.ErrInvalidArgument)
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("audit prune: %w", err)
	}
	defer tx.Rollback()
	sel := "SELECT seq FROM audit WHERE " + where + " ORDER BY seq"
	if limit > 0 {
		sel += fmt.Sprintf(" LIMIT %d", limit)
	}
	var maxSeq sql.NullInt64
	if err := tx.QueryRowContext(ctx, "SELECT MAX(seq) FROM ("+sel+")", args...).Scan(&maxSeq); err != nil {
		return 0, fmt.Errorf("audit prune: %w", err)
	}
	if !maxSeq.Valid {
		return 0, nil
	}
	if _, err := tx.ExecContext(ctx, `UPDATE audit_prune SET max_seq = ? WHERE id = 1`, maxSeq.Int64); err != nil {
		return 0, fmt.Errorf("audit prune: open guard: %w", err)
	}
	res, err := tx.ExecContext(ctx, "DELETE FROM audit WHERE seq IN ("+sel+")", args...)
	if err != nil {
		return 0, fmt.Errorf("audit prune: %w", err)
	}
	n, _ := res.RowsAffected()
	if _, err := tx.ExecContext(ctx, `UPDATE audit_prune SET max_seq = 0 WHERE id = 1`); err != nil {
		return 0, fmt.Errorf("audit prune: close guard: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("audit prune: %w", err)
	}
	return n, nil
}

// AuditRows is how many rows the audit table holds.
func (s *Store) AuditRows(ctx context.Context) (int64, error) {
	var n int64
	if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM audit`).Scan(&n); err != nil {
		return 0, fmt.Errorf("count audit rows: %w", err)
	}
	return n, nil
}

// UsedBytes is how many bytes of the database file hold data (pages not on
// the free list): what retention bounds. Freed pages are reused before the
// file grows, so the file stays near the high-water mark of this figure.
func (s *Store) UsedBytes(ctx context.Context) (int64, error) {
	var pages, free, size int64
	for _, q := range []struct {
		pragma string
		v      *int64
	}{{"page_count", &pages}, {"freelist_count", &free}, {"page_size", &size}} {
		if err := s.db.QueryRowContext(ctx, "PRAGMA "+q.pragma).Scan(q.v); err != nil {
			return 0, fmt.Errorf("database size: %s: %w", q.pragma, err)
		}
	}
	return (pages - free) * size, nil
}

// scanAuditRows reads every row of an audit query selecting seq, time,
// sandbox_id, team_id, api_key_id, kind, action, decision, reason, fields;
// it closes rows.
func scanAuditRows(rows *sql.Rows) ([]AuditRow, error) {
	defer rows.Close()
	var out []AuditRow
	for rows.Next() {
		var r AuditRow
		var ts int64
		if err := rows.Scan(&r.Seq, &ts, &r.SandboxID, &r.TeamID, &r.APIKeyID, &r.Kind, &r.Action, &r.Decision, &r.Reason, &r.Fields); err != nil {
			return nil, err
		}
		r.Time = time.Unix(0, ts)
		out = append(out, r)
	}
	return out, rows.Err()
}
