package store

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/usage"
)

func TestUsageAddsAndSurvivesReopen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "db")
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	h := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	row := func(team, id string, hour time.Time, cpu float64) usage.Row {
		return usage.Row{Key: usage.Key{TeamID: team, Kind: usage.KindSandbox, ID: id, Hour: hour}, TemplateID: "base",
			Amount: usage.Amount{CPUSeconds: cpu, MemoryGiBSeconds: 1, EgressBytes: 10}}
	}
	for _, rows := range [][]usage.Row{
		{row("a", "s1", h, 1), row("b", "s9", h, 100)},
		{row("a", "s1", h, 2), row("a", "s1", h.Add(time.Hour), 4)},
	} {
		if err := s.AddUsage(ctx, rows); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	if s, err = Open(ctx, path); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, tc := range []struct {
		name     string
		from, to time.Time
		cpu      float64
		egress   int64
	}{
		{"all", h.Add(-time.Hour), h.Add(3 * time.Hour), 7, 30},
		{"first hour, from inside it", h.Add(30 * time.Minute), h.Add(time.Hour), 3, 20},
		{"second hour", h.Add(time.Hour), h.Add(2 * time.Hour), 4, 10},
		{"before", h.Add(-2 * time.Hour), h, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rows, err := s.Usage(ctx, "a", tc.from, tc.to)
			if err != nil {
				t.Fatal(err)
			}
			var cpu float64
			var eg int64
			for _, r := range rows {
				if r.TeamID != "a" || r.ID != "s1" || r.TemplateID != "base" {
					t.Errorf("row %+v: not team a's s1 of base", r)
				}
				cpu += r.CPUSeconds
				eg += r.EgressBytes
			}
			if cpu != tc.cpu || eg != tc.egress {
				t.Errorf("cpu %v egress %v, want %v %v", cpu, eg, tc.cpu, tc.egress)
			}
		})
	}
}
