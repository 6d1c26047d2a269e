package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// eventsSchema holds sandbox lifecycle events (E2B's events API), the
// teams' webhooks and the deliveries they are owed. Deliveries live in the
// database so a server killed with deliveries owed sends them after its
// next start; events_cursor is the last audit row turned into events, moved
// in the same transaction as the events it produced.
const eventsSchema = `
CREATE TABLE IF NOT EXISTS sandbox_events (
	seq INTEGER PRIMARY KEY AUTOINCREMENT,
	id TEXT NOT NULL UNIQUE,
	team_id TEXT NOT NULL,
	sandbox_id TEXT NOT NULL,
	type TEXT NOT NULL,
	time INTEGER NOT NULL,
	body TEXT NOT NULL,
	info TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS sandbox_events_team ON sandbox_events(team_id, time);
CREATE INDEX IF NOT EXISTS sandbox_events_sandbox ON sandbox_events(team_id, sandbox_id, time);
CREATE TABLE IF NOT EXISTS webhooks (
	id TEXT PRIMARY KEY,
	team_id TEXT NOT NULL,
	name TEXT NOT NULL,
	url TEXT NOT NULL,
	enabled INTEGER NOT NULL,
	events TEXT NOT NULL,
	secret TEXT NOT NULL,
	created_at INTEGER NOT NULL,
	dropped INTEGER NOT NULL DEFAULT 0,
	last_error TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS webhooks_team ON webhooks(team_id);
CREATE TABLE IF NOT EXISTS webhook_deliveries (
	id TEXT PRIMARY KEY,
	team_id TEXT NOT NULL,
	webhook_id TEXT NOT NULL,
	event_id TEXT NOT NULL,
	body TEXT NOT NULL,
	attempts INTEGER NOT NULL,
	next_at INTEGER NOT NULL,
	created_at INTEGER NOT NULL,
	last_error TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS webhook_deliveries_due ON webhook_deliveries(next_at);
CREATE INDEX IF NOT EXISTS webhook_deliveries_team ON webhook_deliveries(team_id);
CREATE TABLE IF NOT EXISTS events_cursor (
	id INTEGER PRIMARY KEY CHECK (id = 1),
	audit_seq INTEGER NOT NULL
);
`

// EventRow is one stored sandbox event. Body is the event as served (JSON);
// Info is what later events of the same sandbox reuse (JSON), never served.
type EventRow struct {
	ID        string
	TeamID    string
	SandboxID string
	Type      string
	Time      time.Time
	Body      string
	Info      string
}

// WebhookRow is one team webhook. Events lists the event types it gets.
type WebhookRow struct {
	ID        string
	TeamID    string
	Name      string
	URL       string
	Enabled   bool
	Events    []string
	Secret    string
	CreatedAt time.Time
	Dropped   int64  // deliveries refused because the team's queue was full
	LastError string // why the last delivery failed for good, or was dropped
}

// DeliveryRow is one delivery owed to a webhook, joined with the webhook's
// current address and secret.
type DeliveryRow struct {
	ID        string
	TeamID    string
	WebhookID string
	EventID   string
	Body      string
	Attempts  int
	NextAt    time.Time
	URL       string
	Secret    string
}

// InitEvents creates the events tables if they are missing and starts the
// audit cursor at the newest audit row (history before the first start is
// not replayed).
func (s *Store) InitEvents(ctx context.Context) error {
	if err := s.InitAudit(ctx); err != nil { // the cursor reads it
		return err
	}
	if _, err := s.db.ExecContext(ctx, eventsSchema); err != nil {
		return fmt.Errorf("init events tables: %w", err)
	}
	if _, err := s.db.ExecContext(ctx, `INSERT OR IGNORE INTO events_cursor(id, audit_seq)
		VALUES(1, COALESCE((SELECT MAX(seq) FROM audit), 0))`); err != nil {
		return fmt.Errorf("init events cursor: %w", err)
	}
	return nil
}

// EventsCursor is the last audit row turned into events.
func (s *Store) EventsCursor(ctx context.Context) (int64, error) {
	var seq int64
	if err := s.db.QueryRowContext(ctx, `SELECT audit_seq FROM events_cursor WHERE id = 1`).Scan(&seq); err != nil {
		return 0, fmt.Errorf("read events cursor: %w", err)
	}
	return seq, nil
}

// AuditAfter returns up to limit audit rows of kinds after seq, oldest first.
func (s *Store) AuditAfter(ctx context.Context, seq int64, kinds []string, limit int) ([]AuditRow, error) {
	if len(kinds) == 0 || limit <= 0 {
		return nil, nil
	}
	args := []any{seq}
	for _, k := range kinds {
		args = append(args, k)
	}
	args = append(args, limit)
	rows, err := s.db.QueryContext(ctx, `SELECT seq, time, sandbox_id, team_id, api_key_id, kind, action, decision, reason, fields
		FROM audit WHERE seq > ? AND kind IN (?`+strings.Repeat(",?", len(kinds)-1)+`) ORDER BY seq LIMIT ?`, args...)
	if err != nil {
		return nil, fmt.Errorf("read audit log: %w", err)
	}
	out, err := scanAuditRows(rows)
	if err != nil {
		return nil, fmt.Errorf("read audit log: %w", err)
	}
	return out, nil
}

// EventBatch is what AppendEvents stores in one transaction.
type EventBatch struct {
	Events []EventRow
	// Cursor, when above 0, is the audit row these events were made from.
	Cursor int64
	// QueueMax bounds the deliveries one team is owed; a delivery past it
	// is dropped and counted on its webhook with DropReason. 0: no bound.
	QueueMax   int
	DropReason string
	// NewID makes delivery ids.
	NewID func() string
}

// Dropped is one delivery AppendEvents refused because its team's queue
// was full.
type Dropped struct {
	TeamID, WebhookID, EventID string
}

// AppendEvents stores the batch's events, queues a delivery of each to
// every enabled webhook of its team that subscribes to its type, and moves
// the cursor, all or nothing.
func (s *Store) AppendEvents(ctx context.Context, b EventBatch) (queued int, dropped []Dropped, err error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, nil, fmt.Errorf("append events: %w", err)
	}
	defer tx.Rollback()
	now := time.Now().UnixNano()
	hooks := map[string][]WebhookRow{}
	owed := map[string]int{}
	for _, e := range b.Events {
		if _, err := tx.ExecContext(ctx, `INSERT OR IGNORE INTO sandbox_events(id, team_id, sandbox_id, type, time, body, info) VALUES(?,?,?,?,?,?,?)`,
			e.ID, e.TeamID, e.SandboxID, e.Type, e.Time.UnixNano(), e.Body, e.Info); err != nil {
			return 0, nil, fmt.Errorf("append event: %w", err)
		}
		hs, ok := hooks[e.TeamID]
		if !ok {
			if hs, err = listWebhooks(ctx, tx, e.TeamID); err != nil {
				return 0, nil, err
			}
			hooks[e.TeamID] = hs
			var n int
			if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM webhook_deliveries WHERE team_id = ?`, e.TeamID).Scan(&n); err != nil {
				return 0, nil, fmt.Errorf("count deliveries: %w", err)
			}
			owed[e.TeamID] = n
		}
		for _, h := range hs {
			if !h.Enabled || !slices.Contains(h.Events, e.Type) {
				continue
			}
			if b.QueueMax > 0 && owed[e.TeamID] >= b.QueueMax {
				dropped = append(dropped, Dropped{TeamID: e.TeamID, WebhookID: h.ID, EventID: e.ID})
				if _, err := tx.ExecContext(ctx, `UPDATE webhooks SET dropped = dropped + 1, last_error = ? WHERE id = ?`, b.DropReason, h.ID); err != nil {
					return 0, nil, fmt.Errorf("count dropped delivery: %w", err)
				}
				continue
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO webhook_deliveries(id, team_id, webhook_id, event_id, body, attempts, next_at, created_at, last_error)
				VALUES(?,?,?,?,?,0,?,?,'')`, b.NewID(), e.TeamID, h.ID, e.ID, e.Body, now, now); err != nil {
				return 0, nil, fmt.Errorf("queue delivery: %w", err)
			}
			owed[e.TeamID]++
			queued++
		}
	}
	if b.Cursor > 0 {
		if _, err := tx.ExecContext(ctx, `UPDATE events_cursor SET audit_seq = ? WHERE id = 1 AND audit_seq < ?`, b.Cursor, b.Cursor); err != nil {
			return 0, nil, fmt.Errorf("move events cursor: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, nil, fmt.Errorf("append events: %w", err)
	}
	return queued, dropped, nil
}

// EventFilter selects a team's events. TeamID is required.
type EventFilter struct {
	TeamID    string
	SandboxID string // "" = every sandbox of the team
	Types     []string
	Since     time.Time // only events at or after this time
	Offset    int
	Limit     int
	Asc       bool // oldest first; default newest first
}

// ListEvents returns the bodies of the team's matching events.
func (s *Store) ListEvents(ctx context.Context, f EventFilter) ([]string, error) {
	if f.TeamID == "" {
		return nil, fmt.Errorf("list events: no team: %w", errdefs.ErrInvalidArgument)
	}
	where, args := []string{"team_id = ?"}, []any{f.TeamID}
	if f.SandboxID != "" {
		where, args = append(where, "sandbox_id = ?"), append(args, f.SandboxID)
	}
	if len(f.Types) > 0 {
		where = append(where, "type IN (?"+strings.Repeat(",?", len(f.Types)-1)+")")
		for _, t := range f.Types {
			args = append(args, t)
		}
	}
	if !f.Since.IsZero() {
		where, args = append(where, "time >= ?"), append(args, f.Since.UnixNano())
	}
	order := "DESC"
	if f.Asc {
		order = "ASC"
	}
	q := `SELECT body FROM sandbox_events WHERE ` + strings.Join(where, " AND ") + ` ORDER BY time ` + order + `, seq ` + order + ` LIMIT ? OFFSET ?`
	args = append(args, f.Limit, f.Offset)
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	defer rows.Close()
	out := []string{}
	for rows.Next() {
		var b string
		if err := rows.Scan(&b); err != nil {
			return nil, fmt.Errorf("list events: %w", err)
		}
		out = append(out, b)
	}
	return out, rows.Err()
}

// LastEventInfo is the Info of the newest event of the team's sandbox.
func (s *Store) LastEventInfo(ctx context.Context, teamID, sandboxID string) (string, bool, error) {
	var info string
	err := s.db.QueryRowContext(ctx, `SELECT info FROM sandbox_events WHERE team_id = ? AND sandbox_id = ? ORDER BY seq DESC LIMIT 1`, teamID, sandboxID).Scan(&info)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("read sandbox events: %w", err)
	}
	return info, true, nil
}

// PruneEvents removes events older than before, and deliveries queued
// before it that were never made.
func (s *Store) PruneEvents(ctx context.Context, before time.Time) (int64, error) {
	res, err := s.db.ExecContext(ctx, `DELETE FROM sandbox_events WHERE time < ?`, before.UnixNano())
	if err != nil {
		return 0, fmt.Errorf("prune events: %w", err)
	}
	n, _ := res.RowsAffected()
	if _, err := s.db.ExecContext(ctx, `DELETE FROM webhook_deliveries WHERE created_at < ?`, before.UnixNano()); err != nil {
		return n, fmt.Errorf("prune deliveries: %w", err)
	}
	return n, nil
}

// ---- webhooks ----

type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

const webhookCols = `id, team_id, name, url, enabled, events, secret, created_at, dropped, last_error`

func scanWebhooks(rows *sql.Rows) ([]WebhookRow, error) {
	defer rows.Close()
	out := []WebhookRow{}
	for rows.Next() {
		var w WebhookRow
		var events string
		var created int64
		if err := rows.Scan(&w.ID, &w.TeamID, &w.Name, &w.URL, &w.Enabled, &events, &w.Secret, &created, &w.Dropped, &w.LastError); err != nil {
			return nil, fmt.Errorf("read webhooks: %w", err)
		}
		if err := json.Unmarshal([]byte(events), &w.Events); err != nil {
			return nil, fmt.Errorf("webhook %s: events: %w", w.ID, err)
		}
		w.CreatedAt = time.Unix(0, created).UTC()
		out = append(out, w)
	}
	return out, rows.Err()
}

func listWebhooks(ctx context.Context, q querier, teamID string) ([]WebhookRow, error) {
	rows, err := q.QueryContext(ctx, `SELECT `+webhookCols+` FROM webhooks WHERE team_id = ? ORDER BY created_at, id`, teamID)
	if err != nil {
		return nil, fmt.Errorf("read webhooks: %w", err)
	}
	return scanWebhooks(rows)
}

// ListWebhooks returns the team's webhooks, oldest first.
func (s *Store) ListWebhooks(ctx context.Context, teamID string) ([]WebhookRow, error) {
	return listWebhooks(ctx, s.db, teamID)
}

func webhookNotFound(id string) error {
	return fmt.Errorf("webhook %q not found: %w", id, errdefs.ErrNotFound)
}

// GetWebhook returns the team's webhook id.
func (s *Store) GetWebhook(ctx context.Context, teamID, id string) (WebhookRow, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+webhookCols+` FROM webhooks WHERE team_id = ? AND id = ?`, teamID, id)
	if err != nil {
		return WebhookRow{}, fmt.Errorf("read webhook: %w", err)
	}
	ws, err := scanWebhooks(rows)
	if err != nil {
		return WebhookRow{}, err
	}
	if len(ws) == 0 {
		return WebhookRow{}, webhookNotFound(id)
	}
	return ws[0], nil
}

// CreateWebhook stores w unless its team already has max webhooks (0: no
// bound); the refusal wraps errdefs.ErrResourceExhausted.
func (s *Store) CreateWebhook(ctx context.Context, w WebhookRow, max int, flag string) error {
	events, err := json.Marshal(w.Events)
	if err != nil {
		return err
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("create webhook: %w", err)
	}
	defer tx.Rollback()
	if max > 0 {
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM webhooks WHERE team_id = ?`, w.TeamID).Scan(&n); err != nil {
			return fmt.Errorf("count webhooks: %w", err)
		}
		if n >= max {
			return fmt.Errorf("the team has %d webhooks, the most this server allows: delete one (DELETE /events/webhooks/{webhookID}) or ask the operator to raise %s: %w", n, flag, errdefs.ErrResourceExhausted)
		}
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO webhooks(id, team_id, name, url, enabled, events, secret, created_at) VALUES(?,?,?,?,?,?,?,?)`,
		w.ID, w.TeamID, w.Name, w.URL, w.Enabled, string(events), w.Secret, w.CreatedAt.UnixNano()); err != nil {
		return fmt.Errorf("create webhook: %w", err)
	}
	return tx.Commit()
}

// UpdateWebhook replaces the team's webhook w.ID's name, URL, enabled flag,
// events and secret.
func (s *Store) UpdateWebhook(ctx context.Context, w WebhookRow) error {
	events, err := json.Marshal(w.Events)
	if err != nil {
		return err
	}
	res, err := s.db.ExecContext(ctx, `UPDATE webhooks SET name = ?, url = ?, enabled = ?, events = ?, secret = ? WHERE team_id = ? AND id = ?`,
		w.Name, w.URL, w.Enabled, string(events), w.Secret, w.TeamID, w.ID)
	if err != nil {
		return fmt.Errorf("update webhook: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return webhookNotFound(w.ID)
	}
	return nil
}

// DeleteWebhook removes the team's webhook and the deliveries it is owed.
func (s *Store) DeleteWebhook(ctx context.Context, teamID, id string) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("delete webhook: %w", err)
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, `DELETE FROM webhooks WHERE team_id = ? AND id = ?`, teamID, id)
	if err != nil {
		return fmt.Errorf("delete webhook: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return webhookNotFound(id)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM webhook_deliveries WHERE webhook_id = ?`, id); err != nil {
		return fmt.Errorf("delete webhook deliveries: %w", err)
	}
	return tx.Commit()
}

// ---- deliveries ----

// DueDeliveries returns up to limit deliveries due at now, earliest first,
// with their webhook's current address and secret. Deliveries of disabled
// webhooks wait.
func (s *Store) DueDeliveries(ctx context.Context, now time.Time, limit int) ([]DeliveryRow, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT d.id, d.team_id, d.webhook_id, d.event_id, d.body, d.attempts, d.next_at, w.url, w.secret
		FROM webhook_deliveries d JOIN webhooks w ON w.id = d.webhook_id AND w.team_id = d.team_id
		WHERE d.next_at <= ? AND w.enabled = 1 ORDER BY d.next_at LIMIT ?`, now.UnixNano(), limit)
	if err != nil {
		return nil, fmt.Errorf("read deliveries: %w", err)
	}
	defer rows.Close()
	var out []DeliveryRow
	for rows.Next() {
		var d DeliveryRow
		var next int64
		if err := rows.Scan(&d.ID, &d.TeamID, &d.WebhookID, &d.EventID, &d.Body, &d.Attempts, &next, &d.URL, &d.Secret); err != nil {
			return nil, fmt.Errorf("read deliveries: %w", err)
		}
		d.NextAt = time.Unix(0, next)
		out = append(out, d)
	}
	return out, rows.Err()
}

// NextDelivery is when the earliest delivery of an enabled webhook is due.
func (s *Store) NextDelivery(ctx context.Context) (time.Time, bool, error) {
	var next sql.NullInt64
	err := s.db.QueryRowContext(ctx, `SELECT MIN(d.next_at) FROM webhook_deliveries d JOIN webhooks w ON w.id = d.webhook_id WHERE w.enabled = 1`).Scan(&next)
	if err != nil {
		return time.Time{}, false, fmt.Errorf("read deliveries: %w", err)
	}
	if !next.Valid {
		return time.Time{}, false, nil
	}
	return time.Unix(0, next.Int64), true, nil
}

// DeliveryDone removes a delivery the webhook acknowledged.
func (s *Store) DeliveryDone(ctx context.Context, id string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM webhook_deliveries WHERE id = ?`, id); err != nil {
		return fmt.Errorf("delivery done: %w", err)
	}
	return nil
}

// DeliveryRetry records a failed attempt and when to try again.
func (s *Store) DeliveryRetry(ctx context.Context, id string, attempts int, next time.Time, lastErr string) error {
	if _, err := s.db.ExecContext(ctx, `UPDATE webhook_deliveries SET attempts = ?, next_at = ?, last_error = ? WHERE id = ?`,
		attempts, next.UnixNano(), lastErr, id); err != nil {
		return fmt.Errorf("delivery retry: %w", err)
	}
	return nil
}

// DeliveryFailed gives a delivery up and notes why on its webhook.
func (s *Store) DeliveryFailed(ctx context.Context, id, webhookID, why string) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("delivery failed: %w", err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `DELETE FROM webhook_deliveries WHERE id = ?`, id); err != nil {
		return fmt.Errorf("delivery failed: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE webhooks SET last_error = ? WHERE id = ?`, why, webhookID); err != nil {
		return fmt.Errorf("delivery failed: %w", err)
	}
	return tx.Commit()
}

// PendingDeliveries counts the deliveries a webhook is owed.
func (s *Store) PendingDeliveries(ctx context.Context, webhookID string) (int, error) {
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM webhook_deliveries WHERE webhook_id = ?`, webhookID).Scan(&n); err != nil {
		return 0, fmt.Errorf("count deliveries: %w", err)
	}
	return n, nil
}
