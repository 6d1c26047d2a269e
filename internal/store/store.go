// Package store persists agentbox's state (teams and their quotas, API keys,
// sandboxes, server secrets) in an embedded SQLite database in WAL mode, so a
// crash or restart of the server loses nothing that was acknowledged.
package store

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// Store is the SQLite-backed state of one server.
type Store struct {
	db *sql.DB
}

const schema = `
CREATE TABLE IF NOT EXISTS teams (
	id TEXT PRIMARY KEY,
	name TEXT NOT NULL UNIQUE,
	created_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS api_keys (
	id TEXT PRIMARY KEY,
	team_id TEXT NOT NULL REFERENCES teams(id),
	hash TEXT NOT NULL UNIQUE,
	mask TEXT NOT NULL,
	name TEXT NOT NULL,
	created_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS settings (
	key TEXT PRIMARY KEY,
	value BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS sandboxes (
	id TEXT PRIMARY KEY,
	team_id TEXT NOT NULL,
	state TEXT NOT NULL,
	started_at INTEGER NOT NULL,
	end_at INTEGER NOT NULL,
	doc TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS sandboxes_team ON sandboxes(team_id, started_at);
CREATE TABLE IF NOT EXISTS team_quotas (
	team_id TEXT PRIMARY KEY REFERENCES teams(id) ON DELETE CASCADE,
	cpu_count INTEGER,     -- NULL or 0: the server's default
	memory_mb INTEGER,
	disk_mb INTEGER,
	pids INTEGER,
	tmp_mb INTEGER,
	max_sandboxes INTEGER, -- running, paused or starting at once
	updated_at INTEGER NOT NULL
);
`

// columns added to tables after their first release: ALTER TABLE on a
// database made before them (CREATE TABLE IF NOT EXISTS leaves it as it was).
var addedColumns = []struct{ table, column, decl string }{
	{"team_quotas", "max_builds", "INTEGER"}, // template builds in progress at once
}

// addColumns adds the addedColumns a database lacks.
func addColumns(ctx context.Context, db *sql.DB) error {
	for _, c := range addedColumns {
		var n int
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM pragma_table_info(?) WHERE name = ?`, c.table, c.column).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			continue
		}
		if _, err := db.ExecContext(ctx, "ALTER TABLE "+c.table+" ADD COLUMN "+c.column+" "+c.decl); err != nil {
			return err
		}
	}
	return nil
}

// Open opens (creating if needed) the database at path. The database holds
// every team's secrets and the server secret every sandbox token derives
// from, so it and its WAL, shared-memory and journal files are made 0600,
// also when an older version created them wider.
func Open(ctx context.Context, path string) (*Store, error) {
	if err := makePrivate(path); err != nil {
		return nil, err
	}
	dsn := "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)&_pragma=foreign_keys(1)&_pragma=synchronous(NORMAL)"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	// One writer at a time is what SQLite does anyway; a single connection
	// avoids SQLITE_BUSY between our own goroutines.
	db.SetMaxOpenConns(1)
	if _, err := db.ExecContext(ctx, schema+volumeSchema+usageSchema); err != nil {
		db.Close()
		return nil, fmt.Errorf("init schema in %s: %w", path, err)
	}
	if err := addColumns(ctx, db); err != nil {
		db.Close()
		return nil, fmt.Errorf("upgrade schema in %s: %w", path, err)
	}
	// SQLite gives new WAL and -shm files the database file's mode; this
	// also covers ones left over from an older version.
	if err := makePrivate(path); err != nil {
		db.Close()
		return nil, err
	}
	return &Store{db: db}, nil
}

// makePrivate creates the database file 0600 if it is missing and takes
// group and other bits off it and its companion files.
func makePrivate(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("open database %s: %w", path, err)
	}
	f.Close()
	for _, suf := range []string{"", "-wal", "-shm", "-journal"} { // what SQLite keeps next to a database
		p := path + suf
		fi, err := os.Stat(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("database file %s: %w", p, err)
		}
		if fi.Mode().Perm()&0o077 != 0 {
			if err := os.Chmod(p, fi.Mode().Perm()&0o700); err != nil {
				return fmt.Errorf("make database file %s private (0600): %w", p, err)
			}
		}
	}
	return nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

// Team owns API keys and sandboxes; teams never see each other's sandboxes.
type Team struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"createdAt"`
}

// APIKey is a stored key. The plain key is never stored, only its hash.
type APIKey struct {
	ID        string    `json:"id"`
	TeamID    string    `json:"teamID"`
	TeamName  string    `json:"teamName"`
	Mask      string    `json:"mask"` // e2b_abcd…wxyz, for display
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"createdAt"`
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return hex.EncodeToString(b)
}

// HashKey is how keys are stored: they carry 160 random bits, so a plain
// SHA-256 is enough (no dictionary to attack).
func HashKey(plain string) string {
	sum := sha256.Sum256([]byte(plain))
	return hex.EncodeToString(sum[:])
}

// EnsureTeam returns the team with that name, creating it if needed.
func (s *Store) EnsureTeam(ctx context.Context, name string) (Team, error) {
	if name == "" {
		return Team{}, fmt.Errorf("team name is empty: %w", errdefs.ErrInvalidArgument)
	}
	var t Team
	var created int64
	err := s.db.QueryRowContext(ctx, `SELECT id, name, created_at FROM teams WHERE name = ?`, name).Scan(&t.ID, &t.Name, &created)
	if err == nil {
		t.CreatedAt = time.Unix(0, created)
		return t, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return Team{}, fmt.Errorf("look up team %q: %w", name, err)
	}
	t = Team{ID: randomHex(8), Name: name, CreatedAt: time.Now()}
	if _, err := s.db.ExecContext(ctx, `INSERT INTO teams(id, name, created_at) VALUES(?,?,?)`, t.ID, t.Name, t.CreatedAt.UnixNano()); err != nil {
		return Team{}, fmt.Errorf("create team %q: %w", name, err)
	}
	return t, nil
}

// CreateAPIKey mints a key `e2b_` + 40 hex chars (the format the E2B SDKs
// accept) for the team and returns the plain key once.
func (s *Store) CreateAPIKey(ctx context.Context, teamID, name string) (string, APIKey, error) {
	plain := "e2b_" + randomHex(20)
	k := APIKey{ID: randomHex(6), TeamID: teamID, Mask: plain[:8] + "…" + plain[len(plain)-4:], Name: name, CreatedAt: time.Now()}
	_, err := s.db.ExecContext(ctx, `INSERT INTO api_keys(id, team_id, hash, mask, name, created_at) VALUES(?,?,?,?,?,?)`,
		k.ID, k.TeamID, HashKey(plain), k.Mask, k.Name, k.CreatedAt.UnixNano())
	if err != nil {
		return "", APIKey{}, fmt.Errorf("create api key: %w", err)
	}
	return plain, k, nil
}

// Authenticate finds the key matching plain; errdefs.ErrUnauthenticated if none.
func (s *Store) Authenticate(ctx context.Context, plain string) (APIKey, error) {
	var k APIKey
	var created int64
	err := s.db.QueryRowContext(ctx, `SELECT k.id, k.team_id, t.name, k.mask, k.name, k.created_at
		FROM api_keys k JOIN teams t ON t.id = k.team_id WHERE k.hash = ?`, HashKey(plain)).
		Scan(&k.ID, &k.TeamID, &k.TeamName, &k.Mask, &k.Name, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return APIKey{}, fmt.Errorf("invalid API key: %w", errdefs.ErrUnauthenticated)
	}
	if err != nil {
		return APIKey{}, fmt.Errorf("authenticate: %w", err)
	}
	k.CreatedAt = time.Unix(0, created)
	return k, nil
}

// ListAPIKeys lists every key (masked).
func (s *Store) ListAPIKeys(ctx context.Context) ([]APIKey, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT k.id, k.team_id, t.name, k.mask, k.name, k.created_at
		FROM api_keys k JOIN teams t ON t.id = k.team_id ORDER BY k.created_at`)
	if err != nil {
		return nil, fmt.Errorf("list api keys: %w", err)
	}
	defer rows.Close()
	var out []APIKey
	for rows.Next() {
		var k APIKey
		var created int64
		if err := rows.Scan(&k.ID, &k.TeamID, &k.TeamName, &k.Mask, &k.Name, &created); err != nil {
			return nil, err
		}
		k.CreatedAt = time.Unix(0, created)
		out = append(out, k)
	}
	return out, rows.Err()
}

// DeleteAPIKey removes a key by id; errdefs.ErrNotFound if unknown.
func (s *Store) DeleteAPIKey(ctx context.Context, id string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM api_keys WHERE id = ?`, id)
	if err != nil {
		return fmt.Errorf("delete api key %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("api key %q: %w", id, errdefs.ErrNotFound)
	}
	return nil
}

// Secret returns the named server secret, generating 32 random bytes the
// first time. Secrets outlive restarts so derived tokens stay stable.
func (s *Store) Secret(ctx context.Context, name string) ([]byte, error) {
	key := "secret:" + name
	var v []byte
	err := s.db.QueryRowContext(ctx, `SELECT value FROM settings WHERE key = ?`, key).Scan(&v)
	if err == nil {
		return v, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("read secret %s: %w", name, err)
	}
	v = make([]byte, 32)
	if _, err := rand.Read(v); err != nil {
		return nil, err
	}
	if _, err := s.db.ExecContext(ctx, `INSERT OR IGNORE INTO settings(key, value) VALUES(?,?)`, key, v); err != nil {
		return nil, fmt.Errorf("store secret %s: %w", name, err)
	}
	// Re-read: a concurrent writer may have won the insert.
	if err := s.db.QueryRowContext(ctx, `SELECT value FROM settings WHERE key = ?`, key).Scan(&v); err != nil {
		return nil, fmt.Errorf("read secret %s: %w", name, err)
	}
	return v, nil
}

// Record is a persisted sandbox. Doc holds the manager's full description as
// JSON; the columns are what queries filter and sort on.
type Record struct {
	ID        string
	TeamID    string
	State     string
	StartedAt time.Time
	EndAt     time.Time
	Doc       json.RawMessage
}

// PutSandbox inserts or replaces a sandbox record atomically.
func (s *Store) PutSandbox(ctx context.Context, r Record) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO sandboxes(id, team_id, state, started_at, end_at, doc) VALUES(?,?,?,?,?,?)
		ON CONFLICT(id) DO UPDATE SET team_id=excluded.team_id, state=excluded.state, started_at=excluded.started_at,
		end_at=excluded.end_at, doc=excluded.doc`,
		r.ID, r.TeamID, r.State, r.StartedAt.UnixNano(), r.EndAt.UnixNano(), string(r.Doc))
	if err != nil {
		return fmt.Errorf("save sandbox %s: %w", r.ID, err)
	}
	return nil
}

// DeleteSandbox removes a sandbox record; unknown ids are not an error.
func (s *Store) DeleteSandbox(ctx context.Context, id string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM sandboxes WHERE id = ?`, id); err != nil {
		return fmt.Errorf("delete sandbox %s: %w", id, err)
	}
	return nil
}

// ListSandboxes returns every record, newest first.
func (s *Store) ListSandboxes(ctx context.Context) ([]Record, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, team_id, state, started_at, end_at, doc FROM sandboxes ORDER BY started_at DESC, id`)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	defer rows.Close()
	var out []Record
	for rows.Next() {
		var r Record
		var started, end int64
		var doc string
		if err := rows.Scan(&r.ID, &r.TeamID, &r.State, &started, &end, &doc); err != nil {
			return nil, err
		}
		r.StartedAt, r.EndAt, r.Doc = time.Unix(0, started), time.Unix(0, end), json.RawMessage(doc)
		out = append(out, r)
	}
	return out, rows.Err()
}

// ValidTeamName reports whether name is acceptable as a team name.
func ValidTeamName(name string) bool {
	return name != "" && len(name) <= 64 && strings.Trim(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.") == ""
}

// Ping reads from the database: the readiness check of the store.
func (s *Store) Ping(ctx context.Context) error {
	var one int
	if err := s.db.QueryRowContext(ctx, "SELECT 1").Scan(&one); err != nil {
		return fmt.Errorf("database: %w", err)
	}
	return nil
}
