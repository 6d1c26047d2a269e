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

// Volume is a team's persistent volume (internal/volume keeps its files).
// Names are unique within a team; another team's volume is never found by
// any lookup that takes a team.
type Volume struct {
	ID        string    `json:"id"`
	TeamID    string    `json:"teamID"`
	Name      string    `json:"name"`
	SizeMB    int       `json:"sizeMB"`
	CreatedAt time.Time `json:"createdAt"`
}

const volumeSchema = `
CREATE TABLE IF NOT EXISTS volumes (
	id TEXT PRIMARY KEY,
	team_id TEXT NOT NULL REFERENCES teams(id),
	name TEXT NOT NULL,
	size_mb INTEGER NOT NULL,
	created_at INTEGER NOT NULL,
	UNIQUE(team_id, name)
);
`

// CreateVolume inserts v; a name the team already uses is errdefs.ErrConflict.
func (s *Store) CreateVolume(ctx context.Context, v Volume) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO volumes(id, team_id, name, size_mb, created_at) VALUES(?,?,?,?,?)`,
		v.ID, v.TeamID, v.Name, v.SizeMB, v.CreatedAt.UnixNano())
	if err != nil {
		if strings.Contains(err.Error(), "UNIQUE constraint failed") {
			if strings.Contains(err.Error(), "volumes.id") {
				return fmt.Errorf("volume id %s is taken: %w", v.ID, errdefs.ErrConflict)
			}
			return fmt.Errorf("name: the team already has a volume named %q: %w", v.Name, errdefs.ErrConflict)
		}
		if isForeignKey(err) {
			return fmt.Errorf("team %q: %w", v.TeamID, errdefs.ErrNotFound)
		}
		return fmt.Errorf("create volume: %w", err)
	}
	return nil
}

const volumeColumns = `id, team_id, name, size_mb, created_at`

func scanVolume(row interface{ Scan(...any) error }) (Volume, error) {
	var v Volume
	var created int64
	if err := row.Scan(&v.ID, &v.TeamID, &v.Name, &v.SizeMB, &created); err != nil {
		return Volume{}, err
	}
	v.CreatedAt = time.Unix(0, created)
	return v, nil
}

// volumeNotFound is the answer for a volume that is missing or another
// team's: the same words either way.
func volumeNotFound(ref string) error {
	return fmt.Errorf("volume %q not found: %w", ref, errdefs.ErrNotFound)
}

// Volume returns the team's volume with that id.
func (s *Store) Volume(ctx context.Context, teamID, id string) (Volume, error) {
	return s.volumeWhere(ctx, id, `id = ? AND team_id = ?`, id, teamID)
}

// VolumeByName returns the team's volume with that name.
func (s *Store) VolumeByName(ctx context.Context, teamID, name string) (Volume, error) {
	return s.volumeWhere(ctx, name, `name = ? AND team_id = ?`, name, teamID)
}

// VolumeByID returns the volume with that id whatever its team: for
// callers that authorise by other means (a volume's content token names
// its team) and for the server's own housekeeping.
func (s *Store) VolumeByID(ctx context.Context, id string) (Volume, error) {
	return s.volumeWhere(ctx, id, `id = ?`, id)
}

// volumeWhere returns the one volume that matches where; ref names it in
// the not-found error.
func (s *Store) volumeWhere(ctx context.Context, ref, where string, args ...any) (Volume, error) {
	v, err := scanVolume(s.db.QueryRowContext(ctx, `SELECT `+volumeColumns+` FROM volumes WHERE `+where, args...))
	if errors.Is(err, sql.ErrNoRows) {
		return Volume{}, volumeNotFound(ref)
	}
	if err != nil {
		return Volume{}, fmt.Errorf("look up volume: %w", err)
	}
	return v, nil
}

// ListVolumes returns the team's volumes by name; teamID "" lists every
// team's (housekeeping).
func (s *Store) ListVolumes(ctx context.Context, teamID string) ([]Volume, error) {
	q, args := `SELECT `+volumeColumns+` FROM volumes WHERE team_id = ? ORDER BY name`, []any{teamID}
	if teamID == "" {
		q, args = `SELECT `+volumeColumns+` FROM volumes ORDER BY team_id, name`, nil
	}
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list volumes: %w", err)
	}
	defer rows.Close()
	out := []Volume{}
	for rows.Next() {
		v, err := scanVolume(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// CountVolumes returns how many volumes the team has.
func (s *Store) CountVolumes(ctx context.Context, teamID string) (int, error) {
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM volumes WHERE team_id = ?`, teamID).Scan(&n); err != nil {
		return 0, fmt.Errorf("count volumes: %w", err)
	}
	return n, nil
}

// DeleteVolume removes the team's volume row; errdefs.ErrNotFound if the
// team has no volume with that id.
func (s *Store) DeleteVolume(ctx context.Context, teamID, id string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM volumes WHERE id = ? AND team_id = ?`, id, teamID)
	if err != nil {
		return fmt.Errorf("delete volume %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return volumeNotFound(id)
	}
	return nil
}
