package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// TeamQuota caps what one team's creates may ask for. A zero field means
// "the server's default for that field".
type TeamQuota struct {
	CPUCount     int `json:"cpuCount"`
	MemoryMB     int `json:"memoryMB"`
	DiskMB       int `json:"diskSizeMB"`
	PIDs         int `json:"pids"`
	TmpMB        int `json:"tmpSizeMB"`
	MaxSandboxes int `json:"maxSandboxes"` // running, paused or starting at once (a build counts as one)
	MaxBuilds    int `json:"maxBuilds"`    // template builds in progress at once
}

// TeamInfo is a team with its quota row, if any.
type TeamInfo struct {
	Team
	Quota    TeamQuota `json:"quota"`
	HasQuota bool      `json:"hasQuota"`
	APIKeys  int       `json:"apiKeys"`
}

// FindTeam returns the team whose id or name is ref; errdefs.ErrNotFound if none.
func (s *Store) FindTeam(ctx context.Context, ref string) (Team, error) {
	var t Team
	var created int64
	err := s.db.QueryRowContext(ctx, `SELECT id, name, created_at FROM teams WHERE id = ? OR name = ? ORDER BY id = ? DESC LIMIT 1`, ref, ref, ref).
		Scan(&t.ID, &t.Name, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return Team{}, fmt.Errorf("team %q: no team has that id or name: %w", ref, errdefs.ErrNotFound)
	}
	if err != nil {
		return Team{}, fmt.Errorf("look up team %q: %w", ref, err)
	}
	t.CreatedAt = time.Unix(0, created)
	return t, nil
}

// ListTeams lists every team with its quota and key count, oldest first.
func (s *Store) ListTeams(ctx context.Context) ([]TeamInfo, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT t.id, t.name, t.created_at,
		q.team_id IS NOT NULL, IFNULL(q.cpu_count, 0), IFNULL(q.memory_mb, 0), IFNULL(q.disk_mb, 0), IFNULL(q.pids, 0), IFNULL(q.tmp_mb, 0), IFNULL(q.max_sandboxes, 0), IFNULL(q.max_builds, 0),
		(SELECT COUNT(*) FROM api_keys k WHERE k.team_id = t.id)
		FROM teams t LEFT JOIN team_quotas q ON q.team_id = t.id ORDER BY t.created_at, t.id`)
	if err != nil {
		return nil, fmt.Errorf("list teams: %w", err)
	}
	defer rows.Close()
	var out []TeamInfo
	for rows.Next() {
		var ti TeamInfo
		var created int64
		q := &ti.Quota
		if err := rows.Scan(&ti.ID, &ti.Name, &created, &ti.HasQuota, &q.CPUCount, &q.MemoryMB, &q.DiskMB, &q.PIDs, &q.TmpMB, &q.MaxSandboxes, &q.MaxBuilds, &ti.APIKeys); err != nil {
			return nil, err
		}
		ti.CreatedAt = time.Unix(0, created)
		out = append(out, ti)
	}
	return out, rows.Err()
}

// TeamQuota returns the team's stored quota; ok is false when the team has
// none (every field then takes the server's default).
func (s *Store) TeamQuota(ctx context.Context, teamID string) (q TeamQuota, ok bool, err error) {
	err = s.db.QueryRowContext(ctx, `SELECT IFNULL(cpu_count, 0), IFNULL(memory_mb, 0), IFNULL(disk_mb, 0), IFNULL(pids, 0), IFNULL(tmp_mb, 0), IFNULL(max_sandboxes, 0), IFNULL(max_builds, 0)
		FROM team_quotas WHERE team_id = ?`, teamID).Scan(&q.CPUCount, &q.MemoryMB, &q.DiskMB, &q.PIDs, &q.TmpMB, &q.MaxSandboxes, &q.MaxBuilds)
	if errors.Is(err, sql.ErrNoRows) {
		return TeamQuota{}, false, nil
	}
	if err != nil {
		return TeamQuota{}, false, fmt.Errorf("read quota of team %s: %w", teamID, err)
	}
	return q, true, nil
}

// SetTeamQuota stores the team's quota, replacing any earlier one.
func (s *Store) SetTeamQuota(ctx context.Context, teamID string, q TeamQuota) error {
	for _, f := range []struct {
		name string
		v    int
	}{{"cpuCount", q.CPUCount}, {"memoryMB", q.MemoryMB}, {"diskSizeMB", q.DiskMB}, {"pids", q.PIDs}, {"tmpSizeMB", q.TmpMB}, {"maxSandboxes", q.MaxSandboxes}, {"maxBuilds", q.MaxBuilds}} {
		if f.v < 0 {
			return fmt.Errorf("%s: must not be negative, got %d: %w", f.name, f.v, errdefs.ErrInvalidArgument)
		}
	}
	_, err := s.db.ExecContext(ctx, `INSERT INTO team_quotas(team_id, cpu_count, memory_mb, disk_mb, pids, tmp_mb, max_sandboxes, max_builds, updated_at)
		VALUES(?,?,?,?,?,?,?,?,?)
		ON CONFLICT(team_id) DO UPDATE SET cpu_count=excluded.cpu_count, memory_mb=excluded.memory_mb, disk_mb=excluded.disk_mb,
		pids=excluded.pids, tmp_mb=excluded.tmp_mb, max_sandboxes=excluded.max_sandboxes, max_builds=excluded.max_builds, updated_at=excluded.updated_at`,
		teamID, q.CPUCount, q.MemoryMB, q.DiskMB, q.PIDs, q.TmpMB, q.MaxSandboxes, q.MaxBuilds, time.Now().UnixNano())
	if err != nil {
		if isForeignKey(err) {
			return fmt.Errorf("team %q: %w", teamID, errdefs.ErrNotFound)
		}
		return fmt.Errorf("set quota of team %s: %w", teamID, err)
	}
	return nil
}

// ClearTeamQuota removes the team's quota, so the server's defaults apply;
// clearing a team without one is not an error.
func (s *Store) ClearTeamQuota(ctx context.Context, teamID string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM team_quotas WHERE team_id = ?`, teamID); err != nil {
		return fmt.Errorf("clear quota of team %s: %w", teamID, err)
	}
	return nil
}

func isForeignKey(err error) bool {
	return err != nil && strings.Contains(err.Error(), "FOREIGN KEY constraint failed")
}
