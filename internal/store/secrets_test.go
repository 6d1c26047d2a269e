package store

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentbox/agentbox/internal/errdefs"
)

func TestTeamSecrets(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "db")
	st, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	const value = "sk-live-very-secret-0123456789"
	if _, err := st.PutTeamSecret(ctx, "team1", "OPENAI_KEY", "prod key", value); err != nil {
		t.Fatal(err)
	}
	if _, err := st.PutTeamSecret(ctx, "team2", "OPENAI_KEY", "", "other"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		team, name, want string
		err              error
	}{
		{"team1", "OPENAI_KEY", value, nil},
		{"team2", "OPENAI_KEY", "other", nil},
		{"team1", "MISSING", "", errdefs.ErrNotFound},
		{"team3", "OPENAI_KEY", "", errdefs.ErrNotFound},
	} {
		got, err := st.TeamSecretValue(ctx, tc.team, tc.name)
		if got != tc.want || !errors.Is(err, tc.err) {
			t.Errorf("TeamSecretValue(%s, %s) = %q, %v", tc.team, tc.name, got, err)
		}
	}
	list, err := st.ListTeamSecrets(ctx, "team1")
	if err != nil || len(list) != 1 || list[0].Name != "OPENAI_KEY" || list[0].Description != "prod key" {
		t.Fatalf("list = %+v, %v", list, err)
	}
	// Replacing keeps one row.
	if _, err := st.PutTeamSecret(ctx, "team1", "OPENAI_KEY", "rotated", value+"2"); err != nil {
		t.Fatal(err)
	}
	if v, _ := st.TeamSecretValue(ctx, "team1", "OPENAI_KEY"); v != value+"2" {
		t.Errorf("after replace: %q", v)
	}
	// Encrypted at rest: the plain value is nowhere in the database files.
	st.db.ExecContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)")
	for _, f := range []string{path, path + "-wal"} {
		b, _ := os.ReadFile(f)
		if bytes.Contains(b, []byte("sk-live-very-secret")) {
			t.Errorf("%s holds the plain secret", f)
		}
	}
	if err := st.DeleteTeamSecret(ctx, "team1", "OPENAI_KEY"); err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteTeamSecret(ctx, "team1", "OPENAI_KEY"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("second delete: %v", err)
	}
}
