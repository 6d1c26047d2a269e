package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// TestVolumesTeamScoped: every lookup that takes a team finds only that
// team's volumes; another team's id or name is the same not-found as a
// missing one, and a delete by another team leaves the volume alone.
func TestVolumesTeamScoped(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	a, _ := s.EnsureTeam(ctx, "a")
	b, _ := s.EnsureTeam(ctx, "b")
	va := Volume{ID: "11111111-1111-4111-8111-111111111111", TeamID: a.ID, Name: "ws", SizeMB: 64, CreatedAt: time.Now()}
	if err := s.CreateVolume(ctx, va); err != nil {
		t.Fatal(err)
	}
	// The same name in another team is another volume.
	vb := Volume{ID: "22222222-2222-4222-8222-222222222222", TeamID: b.ID, Name: "ws", SizeMB: 32, CreatedAt: time.Now()}
	if err := s.CreateVolume(ctx, vb); err != nil {
		t.Fatal(err)
	}
	dup := va
	dup.ID = "33333333-3333-4333-8333-333333333333"
	if err := s.CreateVolume(ctx, dup); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("second volume named ws in team a: %v, want conflict", err)
	}
	if err := s.CreateVolume(ctx, Volume{ID: "x", TeamID: "no-such-team", Name: "n", SizeMB: 1}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("volume of a missing team: %v", err)
	}

	if got, err := s.Volume(ctx, a.ID, va.ID); err != nil || got.Name != "ws" || got.SizeMB != 64 || got.TeamID != a.ID {
		t.Fatalf("own volume: %+v %v", got, err)
	}
	_, missing := s.Volume(ctx, a.ID, "44444444-4444-4444-8444-444444444444")
	_, foreign := s.Volume(ctx, a.ID, vb.ID)
	if !errors.Is(foreign, errdefs.ErrNotFound) || !errors.Is(missing, errdefs.ErrNotFound) {
		t.Fatalf("another team's volume by id: %v (missing one: %v)", foreign, missing)
	}
	if got, err := s.VolumeByName(ctx, b.ID, "ws"); err != nil || got.ID != vb.ID {
		t.Fatalf("by name in team b: %+v %v", got, err)
	}
	if _, err := s.VolumeByName(ctx, b.ID, "other"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("missing name: %v", err)
	}
	list, err := s.ListVolumes(ctx, a.ID)
	if err != nil || len(list) != 1 || list[0].ID != va.ID {
		t.Fatalf("team a lists %+v %v", list, err)
	}
	all, _ := s.ListVolumes(ctx, "")
	if len(all) != 2 {
		t.Fatalf("housekeeping list: %+v", all)
	}
	if n, _ := s.CountVolumes(ctx, b.ID); n != 1 {
		t.Fatalf("team b has %d volumes", n)
	}
	if err := s.DeleteVolume(ctx, b.ID, va.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("team b deletes team a's volume: %v", err)
	}
	if _, err := s.Volume(ctx, a.ID, va.ID); err != nil {
		t.Fatalf("team a's volume is gone after team b's delete: %v", err)
	}
	if got, err := s.VolumeByID(ctx, va.ID); err != nil || got.TeamID != a.ID {
		t.Fatalf("by id: %+v %v", got, err)
	}
	if err := s.DeleteVolume(ctx, a.ID, va.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.VolumeByID(ctx, va.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("deleted volume: %v", err)
	}
	// The name is free again.
	va.ID = "55555555-5555-4555-8555-555555555555"
	if err := s.CreateVolume(ctx, va); err != nil {
		t.Fatalf("reuse of a deleted volume's name: %v", err)
	}
}
