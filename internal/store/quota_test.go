package store

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/errdefs"
)

func TestTeamQuota(t *testing.T) {
	ctx := context.Background()
	s, path := open(t)
	team, err := s.EnsureTeam(ctx, "research")
	if err != nil {
		t.Fatal(err)
	}
	other, _ := s.EnsureTeam(ctx, "other")

	if q, ok, err := s.TeamQuota(ctx, team.ID); err != nil || ok || q != (TeamQuota{}) {
		t.Fatalf("no quota yet: %+v, %v, %v", q, ok, err)
	}
	want := TeamQuota{CPUCount: 2, MemoryMB: 512, MaxSandboxes: 3, MaxBuilds: 1}
	if err := s.SetTeamQuota(ctx, team.ID, want); err != nil {
		t.Fatal(err)
	}
	if q, ok, err := s.TeamQuota(ctx, team.ID); err != nil || !ok || q != want {
		t.Fatalf("after set: %+v, %v, %v; want %+v", q, ok, err, want)
	}
	// Set replaces the whole row.
	want = TeamQuota{PIDs: 100}
	if err := s.SetTeamQuota(ctx, team.ID, want); err != nil {
		t.Fatal(err)
	}
	if q, _, _ := s.TeamQuota(ctx, team.ID); q != want {
		t.Fatalf("after second set: %+v; want %+v", q, want)
	}
	if _, ok, _ := s.TeamQuota(ctx, other.ID); ok {
		t.Fatal("another team got the quota")
	}

	// It survives a reopen.
	s.Close()
	s, err = Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if q, ok, _ := s.TeamQuota(ctx, team.ID); !ok || q != want {
		t.Fatalf("after reopen: %+v, %v", q, ok)
	}

	teams, err := s.ListTeams(ctx)
	if err != nil || len(teams) != 2 {
		t.Fatalf("ListTeams = %+v, %v", teams, err)
	}
	for _, ti := range teams {
		if ti.HasQuota != (ti.ID == team.ID) {
			t.Errorf("team %s: HasQuota = %v", ti.Name, ti.HasQuota)
		}
	}

	if err := s.ClearTeamQuota(ctx, team.ID); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := s.TeamQuota(ctx, team.ID); ok {
		t.Fatal("quota still there after clear")
	}
	if err := s.ClearTeamQuota(ctx, team.ID); err != nil {
		t.Fatalf("second clear: %v", err)
	}
}

func TestSetTeamQuotaErrors(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	team, _ := s.EnsureTeam(ctx, "t")
	tests := []struct {
		name   string
		teamID string
		q      TeamQuota
		want   error
	}{
		{"negative memory", team.ID, TeamQuota{MemoryMB: -1}, errdefs.ErrInvalidArgument},
		{"negative max sandboxes", team.ID, TeamQuota{MaxSandboxes: -5}, errdefs.ErrInvalidArgument},
		{"unknown team", "nope", TeamQuota{CPUCount: 1}, errdefs.ErrNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := s.SetTeamQuota(ctx, tt.teamID, tt.q); !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestFindTeam(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	team, _ := s.EnsureTeam(ctx, "research")
	for _, ref := range []string{team.ID, "research"} {
		if got, err := s.FindTeam(ctx, ref); err != nil || got.ID != team.ID {
			t.Errorf("FindTeam(%q) = %+v, %v", ref, got, err)
		}
	}
	if _, err := s.FindTeam(ctx, "missing"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("FindTeam(missing) = %v, want ErrNotFound", err)
	}
}

// TestTeamQuotaUpgrade: a database made before maxBuilds existed keeps its
// quotas and gains the field when opened.
func TestTeamQuotaUpgrade(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "old.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	old := strings.Replace(schema, "\tmax_sandboxes INTEGER, -- running, paused or starting at once\n", "\tmax_sandboxes INTEGER,\n", 1)
	if _, err := db.ExecContext(ctx, old+`INSERT INTO teams VALUES('t1', 'research', 1);
		INSERT INTO team_quotas(team_id, memory_mb, max_sandboxes, updated_at) VALUES('t1', 512, 3, 1);`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	for range 2 { // and a second open finds it there
		s, err := Open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		if q, ok, err := s.TeamQuota(ctx, "t1"); err != nil || !ok || q.MemoryMB != 512 || q.MaxSandboxes != 3 {
			t.Fatalf("old quota after the upgrade: %+v %v %v", q, ok, err)
		}
		if err := s.SetTeamQuota(ctx, "t1", TeamQuota{MemoryMB: 512, MaxSandboxes: 3, MaxBuilds: 4}); err != nil {
			t.Fatal(err)
		}
		if q, _, _ := s.TeamQuota(ctx, "t1"); q.MaxBuilds != 4 {
			t.Fatalf("maxBuilds after the upgrade: %+v", q)
		}
		s.Close()
	}
}
