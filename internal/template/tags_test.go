package template

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
)

func TestTags(t *testing.T) {
	ctx := context.Background()
	s, err := NewStore(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	for i, tpl := range []*Template{
		{ID: "tv1", TeamID: "a", Aliases: []string{"app"}, Tags: []string{"default", "v1", "stable"}, CreatedAt: now.Add(-time.Hour)},
		{ID: "tv2", TeamID: "a", Aliases: []string{"app"}, Tags: []string{"v2"}, CreatedAt: now},
		{ID: "tother", TeamID: "a", Aliases: []string{"other"}, Tags: []string{"stable"}, CreatedAt: now},
		// Another team's template of the same name keeps its tags.
		{ID: "tb", TeamID: "b", Aliases: []string{"app"}, Tags: []string{"stable", "prod"}, CreatedAt: now},
	} {
		if err := s.Register(ctx, tpl); err != nil {
			t.Fatalf("register %d: %v", i, err)
		}
	}
	tagsOf := func(id string) []string {
		t.Helper()
		tpl, err := s.Get(ctx, "a", id)
		if err != nil {
			t.Fatal(err)
		}
		return tpl.Tags
	}
	resolve := func(ref string) string {
		t.Helper()
		tpl, err := s.Get(ctx, "a", ref)
		if err != nil {
			t.Fatalf("Get(%q): %v", ref, err)
		}
		return tpl.ID
	}

	// Moving "stable" to v2 takes it from v1, not from another name.
	if _, err := s.AssignTags(ctx, "a", "app:v2", []string{"stable", "prod"}); err != nil {
		t.Fatal(err)
	}
	if got := resolve("app:stable"); got != "tv2" {
		t.Errorf("app:stable -> %s, want tv2", got)
	}
	if got := resolve("app:prod"); got != "tv2" {
		t.Errorf("app:prod -> %s, want tv2", got)
	}
	if got := tagsOf("tv1"); !slices.Equal(got, []string{"default", "v1"}) {
		t.Errorf("tv1 tags = %v", got)
	}
	if got := tagsOf("tother"); !slices.Equal(got, []string{"stable"}) {
		t.Errorf("other name lost its tag: %v", got)
	}
	// By ID: the tags belong to the template's name.
	if _, err := s.AssignTags(ctx, "a", "tv1", []string{"prod"}); err != nil {
		t.Fatal(err)
	}
	if got := resolve("app:prod"); got != "tv1" {
		t.Errorf("app:prod -> %s after assigning by id, want tv1", got)
	}

	if err := s.RemoveTags(ctx, "a", "app", []string{"prod", "stable", "never-there"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "a", "app:stable"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("app:stable after removal: %v", err)
	}
	if got := resolve("app:v2"); got != "tv2" {
		t.Errorf("app:v2 -> %s, want tv2 (other tags stay)", got)
	}

	for _, tc := range []struct {
		name string
		err  error
		fn   func() error
	}{
		{"unknown target", errdefs.ErrNotFound, func() error { _, err := s.AssignTags(ctx, "a", "nope:v1", []string{"x"}); return err }},
		{"bad tag", errdefs.ErrInvalidArgument, func() error { _, err := s.AssignTags(ctx, "a", "app:v1", []string{"Bad Tag"}); return err }},
		{"no tags", errdefs.ErrInvalidArgument, func() error { _, err := s.AssignTags(ctx, "a", "app:v1", nil); return err }},
		{"unknown name", errdefs.ErrNotFound, func() error { return s.RemoveTags(ctx, "a", "nope", []string{"x"}) }},
	} {
		if err := tc.fn(); !errors.Is(err, tc.err) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.err)
		}
	}

	if got, err := s.Get(ctx, "b", "app:prod"); err != nil || got.ID != "tb" || !slices.Equal(got.Tags, []string{"stable", "prod"}) {
		t.Errorf("team b's app after team a's retagging: %+v, %v", got, err)
	}
	// Team b cannot tag or untag team a's templates, by name or by ID.
	for _, tc := range []struct {
		name string
		fn   func() error
	}{
		{"tag a's ID", func() error { _, err := s.AssignTags(ctx, "b", "tv1", []string{"x"}); return err }},
		{"tag a's other name", func() error { _, err := s.AssignTags(ctx, "b", "other:stable", []string{"x"}); return err }},
		{"untag a's other name", func() error { return s.RemoveTags(ctx, "b", "other", []string{"stable"}) }},
	} {
		if err := tc.fn(); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("%s: got %v, want ErrNotFound", tc.name, err)
		}
	}
	if got := tagsOf("tother"); !slices.Equal(got, []string{"stable"}) {
		t.Errorf("team b changed team a's tags: %v", got)
	}

	a, _ := s.Get(ctx, "a", "tv1")
	b, _ := s.Get(ctx, "a", "tv2")
	if BuildRef(a) == BuildRef(b) || BuildRef(a) != BuildRef(a) || len(BuildRef(a)) != 36 {
		t.Errorf("build refs: %s %s", BuildRef(a), BuildRef(b))
	}
}
