package store

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// Team secrets are values (API keys, tokens) the egress proxy injects into
// a sandbox's outbound requests; the sandbox never sees them. They are
// encrypted at rest with AES-256-GCM under the server secret "secrets", and
// only the proxy path ever decrypts them: the API never returns a value.

const secretsSchema = `
CREATE TABLE IF NOT EXISTS team_secrets (
	team_id TEXT NOT NULL,
	name TEXT NOT NULL,
	description TEXT NOT NULL,
	nonce BLOB NOT NULL,
	value BLOB NOT NULL,
	created_at INTEGER NOT NULL,
	updated_at INTEGER NOT NULL,
	PRIMARY KEY (team_id, name)
);
`

// SecretInfo describes a stored team secret, never its value.
type SecretInfo struct {
	Name        string    `json:"name"`
	Description string    `json:"description,omitempty"`
	CreatedAt   time.Time `json:"createdAt"`
	UpdatedAt   time.Time `json:"updatedAt"`
}

func (s *Store) secretsAEAD(ctx context.Context) (cipher.AEAD, error) {
	if _, err := s.db.ExecContext(ctx, secretsSchema); err != nil {
		return nil, fmt.Errorf("init secrets table: %w", err)
	}
	key, err := s.Secret(ctx, "secrets")
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// secretAAD binds a ciphertext to its row: a value copied to another team
// or name does not decrypt.
func secretAAD(teamID, name string) []byte { return []byte(teamID + "\x00" + name) }

// PutTeamSecret creates or replaces a team secret.
func (s *Store) PutTeamSecret(ctx context.Context, teamID, name, description, value string) (SecretInfo, error) {
	aead, err := s.secretsAEAD(ctx)
	if err != nil {
		return SecretInfo{}, err
	}
	nonce := make([]byte, aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return SecretInfo{}, err
	}
	sealed := aead.Seal(nil, nonce, []byte(value), secretAAD(teamID, name))
	now := time.Now().UTC()
	_, err = s.db.ExecContext(ctx, `INSERT INTO team_secrets(team_id, name, description, nonce, value, created_at, updated_at)
		VALUES(?,?,?,?,?,?,?) ON CONFLICT(team_id, name) DO UPDATE SET description=excluded.description,
		nonce=excluded.nonce, value=excluded.value, updated_at=excluded.updated_at`,
		teamID, name, description, nonce, sealed, now.UnixNano(), now.UnixNano())
	if err != nil {
		return SecretInfo{}, fmt.Errorf("store secret %s: %w", name, err)
	}
	return s.teamSecretInfo(ctx, teamID, name)
}

func (s *Store) teamSecretInfo(ctx context.Context, teamID, name string) (SecretInfo, error) {
	var i SecretInfo
	var created, updated int64
	err := s.db.QueryRowContext(ctx, `SELECT name, description, created_at, updated_at FROM team_secrets WHERE team_id = ? AND name = ?`,
		teamID, name).Scan(&i.Name, &i.Description, &created, &updated)
	if errors.Is(err, sql.ErrNoRows) {
		return i, fmt.Errorf("secret %q does not exist: %w", name, errdefs.ErrNotFound)
	}
	if err != nil {
		return i, fmt.Errorf("read secret %s: %w", name, err)
	}
	i.CreatedAt, i.UpdatedAt = time.Unix(0, created).UTC(), time.Unix(0, updated).UTC()
	return i, nil
}

// ListTeamSecrets returns the team's secrets by name, without values.
func (s *Store) ListTeamSecrets(ctx context.Context, teamID string) ([]SecretInfo, error) {
	if _, err := s.db.ExecContext(ctx, secretsSchema); err != nil {
		return nil, fmt.Errorf("init secrets table: %w", err)
	}
	rows, err := s.db.QueryContext(ctx, `SELECT name, description, created_at, updated_at FROM team_secrets WHERE team_id = ? ORDER BY name`, teamID)
	if err != nil {
		return nil, fmt.Errorf("list secrets: %w", err)
	}
	defer rows.Close()
	out := []SecretInfo{}
	for rows.Next() {
		var i SecretInfo
		var created, updated int64
		if err := rows.Scan(&i.Name, &i.Description, &created, &updated); err != nil {
			return nil, err
		}
		i.CreatedAt, i.UpdatedAt = time.Unix(0, created).UTC(), time.Unix(0, updated).UTC()
		out = append(out, i)
	}
	return out, rows.Err()
}

// DeleteTeamSecret removes a secret; ErrNotFound if there is none.
func (s *Store) DeleteTeamSecret(ctx context.Context, teamID, name string) error {
	if _, err := s.db.ExecContext(ctx, secretsSchema); err != nil {
		return fmt.Errorf("init secrets table: %w", err)
	}
	res, err := s.db.ExecContext(ctx, `DELETE FROM team_secrets WHERE team_id = ? AND name = ?`, teamID, name)
	if err != nil {
		return fmt.Errorf("delete secret %s: %w", name, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("secret %q does not exist: %w", name, errdefs.ErrNotFound)
	}
	return nil
}

// TeamSecretValue decrypts a secret for the egress proxy.
func (s *Store) TeamSecretValue(ctx context.Context, teamID, name string) (string, error) {
	aead, err := s.secretsAEAD(ctx)
	if err != nil {
		return "", err
	}
	var nonce, sealed []byte
	err = s.db.QueryRowContext(ctx, `SELECT nonce, value FROM team_secrets WHERE team_id = ? AND name = ?`, teamID, name).Scan(&nonce, &sealed)
	if errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("secret %q does not exist: %w", name, errdefs.ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("read secret %s: %w", name, err)
	}
	plain, err := aead.Open(nil, nonce, sealed, secretAAD(teamID, name))
	if err != nil {
		return "", fmt.Errorf("decrypt secret %s: %w", name, err)
	}
	return string(plain), nil
}
