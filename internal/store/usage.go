package store

import (
	"context"
	"fmt"
	"time"

	"github.com/agentbox/agentbox/internal/usage"
)

// usageSchema keeps metered usage in hourly rows per team and object
// (sandbox or snapshot). Rows outlive their sandbox: a removed sandbox's
// totals stay billable.
const usageSchema = `
CREATE TABLE IF NOT EXISTS usage (
	team_id TEXT NOT NULL,
	kind TEXT NOT NULL,       -- sandbox or snapshot
	object_id TEXT NOT NULL,
	hour INTEGER NOT NULL,    -- unix seconds, start of the UTC hour
	template_id TEXT NOT NULL DEFAULT '',
	cpu_seconds REAL NOT NULL DEFAULT 0,
	memory_gib_seconds REAL NOT NULL DEFAULT 0,
	disk_gib_hours REAL NOT NULL DEFAULT 0,
	egress_bytes INTEGER NOT NULL DEFAULT 0,
	PRIMARY KEY (team_id, hour, kind, object_id)
);
`

// AddUsage adds rows to the stored amounts, in one transaction.
func (s *Store) AddUsage(ctx context.Context, rows []usage.Row) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("add usage: %w", err)
	}
	defer tx.Rollback()
	// One statement for every row: a tick flushes a row per metered object.
	stmt, err := tx.PrepareContext(ctx, `INSERT INTO usage (team_id, kind, object_id, hour, template_id, cpu_seconds, memory_gib_seconds, disk_gib_hours, egress_bytes)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (team_id, hour, kind, object_id) DO UPDATE SET
				template_id = CASE WHEN excluded.template_id != '' THEN excluded.template_id ELSE template_id END,
				cpu_seconds = cpu_seconds + excluded.cpu_seconds,
				memory_gib_seconds = memory_gib_seconds + excluded.memory_gib_seconds,
				disk_gib_hours = disk_gib_hours + excluded.disk_gib_hours,
				egress_bytes = egress_bytes + excluded.egress_bytes`)
	if err != nil {
		return fmt.Errorf("add usage: %w", err)
	}
	defer stmt.Close()
	for _, r := range rows {
		if _, err := stmt.ExecContext(ctx, r.TeamID, r.Kind, r.ID, r.Hour.Unix(), r.TemplateID, r.CPUSeconds, r.MemoryGiBSeconds, r.DiskGiBHours, r.EgressBytes); err != nil {
			return fmt.Errorf("add usage of %s %s: %w", r.Kind, r.ID, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("add usage: %w", err)
	}
	return nil
}

// Usage sums the team's usage per object over the hours that overlap
// [from, to): rows are hourly, so the window widens to whole hours.
func (s *Store) Usage(ctx context.Context, teamID string, from, to time.Time) ([]usage.Row, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT kind, object_id, MAX(template_id), SUM(cpu_seconds), SUM(memory_gib_seconds), SUM(disk_gib_hours), SUM(egress_bytes)
		FROM usage WHERE team_id = ? AND hour > ? AND hour < ?
		GROUP BY kind, object_id ORDER BY kind, object_id`,
		teamID, from.Unix()-int64(time.Hour/time.Second), to.Unix())
	if err != nil {
		return nil, fmt.Errorf("read usage of team %s: %w", teamID, err)
	}
	defer rows.Close()
	var out []usage.Row
	for rows.Next() {
		r := usage.Row{Key: usage.Key{TeamID: teamID}}
		if err := rows.Scan(&r.Kind, &r.ID, &r.TemplateID, &r.CPUSeconds, &r.MemoryGiBSeconds, &r.DiskGiBHours, &r.EgressBytes); err != nil {
			return nil, fmt.Errorf("read usage of team %s: %w", teamID, err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}
