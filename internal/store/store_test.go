package store

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
)

func open(t *testing.T) (*Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "a.db")
	s, err := Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, path
}

func TestAPIKeys(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	team, err := s.EnsureTeam(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	again, _ := s.EnsureTeam(ctx, "default")
	if again.ID != team.ID {
		t.Fatalf("EnsureTeam twice gave %s and %s", team.ID, again.ID)
	}
	plain, k, err := s.CreateAPIKey(ctx, team.ID, "ci")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^e2b_[0-9a-f]{40}$`).MatchString(plain) {
		t.Fatalf("key %q does not have the E2B shape", plain)
	}
	got, err := s.Authenticate(ctx, plain)
	if err != nil || got.ID != k.ID || got.TeamName != "default" {
		t.Fatalf("Authenticate = %+v, %v", got, err)
	}
	for _, bad := range []string{"", "e2b_", plain + "0", plain[:len(plain)-1]} {
		if _, err := s.Authenticate(ctx, bad); !errors.Is(err, errdefs.ErrUnauthenticated) {
			t.Errorf("Authenticate(%q) = %v, want ErrUnauthenticated", bad, err)
		}
	}
	if err := s.DeleteAPIKey(ctx, k.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(ctx, plain); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Fatalf("deleted key still authenticates: %v", err)
	}
	if err := s.DeleteAPIKey(ctx, k.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("second delete = %v, want ErrNotFound", err)
	}
}

// The plain key must never be written to the database file.
func TestKeyStoredHashed(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	team, _ := s.EnsureTeam(ctx, "t")
	plain, _, _ := s.CreateAPIKey(ctx, team.ID, "")
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM api_keys WHERE hash = ? OR mask = ? OR name = ?`, plain, plain, plain).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatal("plain key found in the database")
	}
}

func TestSecretStableAcrossReopen(t *testing.T) {
	ctx := context.Background()
	s, path := open(t)
	a, err := s.Secret(ctx, "x")
	if err != nil || len(a) != 32 {
		t.Fatalf("Secret = %x, %v", a, err)
	}
	s.Close()
	s2, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	b, _ := s2.Secret(ctx, "x")
	if string(a) != string(b) {
		t.Fatal("secret changed after reopen")
	}
	c, _ := s2.Secret(ctx, "y")
	if string(a) == string(c) {
		t.Fatal("two secrets are equal")
	}
}

func TestSandboxRecords(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	now := time.Now()
	for i, id := range []string{"ia", "ib"} {
		r := Record{ID: id, TeamID: "t", State: "running", StartedAt: now.Add(time.Duration(i) * time.Second), EndAt: now.Add(time.Minute), Doc: json.RawMessage(`{"id":"` + id + `"}`)}
		if err := s.PutSandbox(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.PutSandbox(ctx, Record{ID: "ia", TeamID: "t", State: "killing", StartedAt: now, EndAt: now, Doc: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	rs, err := s.ListSandboxes(ctx)
	if err != nil || len(rs) != 2 || rs[0].ID != "ib" || rs[1].State != "killing" {
		t.Fatalf("ListSandboxes = %+v, %v", rs, err)
	}
	if err := s.DeleteSandbox(ctx, "ia"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSandbox(ctx, "nope"); err != nil {
		t.Fatal(err)
	}
	rs, _ = s.ListSandboxes(ctx)
	if len(rs) != 1 {
		t.Fatalf("after delete: %d records", len(rs))
	}
}

// TestOpenPrivate checks that the database and its WAL and shared-memory
// files are unreadable to other host users, also when an older version left
// them world-readable.
func TestOpenPrivate(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "a.db")
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	for round := range 2 {
		s, err := Open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Secret(ctx, "token"); err != nil {
			t.Fatal(err)
		}
		for _, suf := range []string{"", "-wal", "-shm"} {
			fi, err := os.Stat(path + suf)
			if err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
			if fi.Mode().Perm()&0o077 != 0 {
				t.Errorf("round %d: %s has mode %v, want no group/other bits", round, path+suf, fi.Mode().Perm())
			}
		}
		s.Close()
		// An older version's files: world-readable. Open must tighten them.
		for _, suf := range []string{"", "-wal", "-shm"} {
			_ = os.Chmod(path+suf, 0o666)
		}
	}
}
