package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// AssignTags points tags of one of team's template names at the template
// target names ("name:tag", "name" or an ID): target gets them, and every
// other template of that name in the team loses them, so "name:tag"
// resolves to target from now on. It returns the updated target. Only the
// owner may tag: another team's template is ErrNotFound.
func (s *Store) AssignTags(ctx context.Context, team, target string, tags []string) (*Template, error) {
	if len(tags) == 0 {
		return nil, fmt.Errorf("no tags to assign: %w", errdefs.ErrInvalidArgument)
	}
	tags, err := normalizeTags(tags)
	if err != nil {
		return nil, err
	}
	t, err := s.GetOwned(ctx, team, target)
	if err != nil {
		return nil, err
	}
	name, _, _ := strings.Cut(target, ":")
	if !slices.Contains(t.Aliases, name) {
		// Addressed by ID: its first alias is the name the tags belong to.
		if len(t.Aliases) == 0 {
			return nil, fmt.Errorf("template %s has no name to tag: %w", t.ID, errdefs.ErrInvalidArgument)
		}
		name = t.Aliases[0]
	}
	unlock := s.locks.lock("name/" + team + "/" + name)
	defer unlock()
	if t, err = s.GetOwned(ctx, team, t.ID); err != nil { // re-read under the lock
		return nil, err
	}
	all, err := s.listAll(ctx)
	if err != nil {
		return nil, err
	}
	for _, o := range all {
		if o.ID == t.ID || !o.OwnedBy(team) || !slices.Contains(o.Aliases, name) {
			continue
		}
		if kept := slices.DeleteFunc(slices.Clone(o.Tags), func(x string) bool { return slices.Contains(tags, x) }); len(kept) != len(o.Tags) {
			o.Tags = kept
			if err := writeMeta(filepath.Join(s.dir, o.ID), o); err != nil {
				return nil, err
			}
		}
	}
	t.Tags = slices.Compact(slices.Sorted(slices.Values(append(TagsOf(t), tags...))))
	if err := writeMeta(filepath.Join(s.dir, t.ID), t); err != nil {
		return nil, err
	}
	return t, nil
}

// RemoveTags takes tags away from every template of team named name.
// Templates stay reachable by ID and name. Tags nothing of that name has are
// not an error, but a name the team has no template of is ErrNotFound (also
// when another team, a builtin or a public template has it).
func (s *Store) RemoveTags(ctx context.Context, team, name string, tags []string) error {
	tags, err := normalizeTags(tags)
	if err != nil {
		return err
	}
	unlock := s.locks.lock("name/" + team + "/" + name)
	defer unlock()
	all, err := s.listAll(ctx)
	if err != nil {
		return err
	}
	found := false
	for _, t := range all {
		if !t.OwnedBy(team) || !slices.Contains(t.Aliases, name) {
			continue
		}
		found = true
		if kept := slices.DeleteFunc(slices.Clone(t.Tags), func(x string) bool { return slices.Contains(tags, x) }); len(kept) != len(t.Tags) {
			t.Tags = kept
			if err := writeMeta(filepath.Join(s.dir, t.ID), t); err != nil {
				return err
			}
		}
	}
	if !found {
		return fmt.Errorf("template %q: %w", name, errdefs.ErrNotFound)
	}
	return nil
}

// BuildRef is the build ID reported for t: the E2B API names tags by build;
// a template here is one build, so it is the ID of the API build that made
// it, or else one derived from the template's ID and creation time (stable,
// changes with every rebuild).
func BuildRef(t *Template) string {
	if t.BuildID != "" {
		return t.BuildID
	}
	sum := sha256.Sum256([]byte(t.ID + "@" + t.CreatedAt.UTC().Format("2006-01-02T15:04:05.999999999Z")))
	h := hex.EncodeToString(sum[:16])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

func normalizeTags(tags []string) ([]string, error) {
	out := make([]string, 0, len(tags))
	for _, t := range tags {
		if !namePattern.MatchString(t) {
			return nil, fmt.Errorf("tag %q: want lowercase letters, digits, '.', '_' or '-': %w", t, errdefs.ErrInvalidArgument)
		}
		out = append(out, t)
	}
	return out, nil
}

// TagsOf is t's tags; a template built without any (a bootstrapped
// builtin) has "default", which name:default resolves to.
func TagsOf(t *Template) []string {
	if len(t.Tags) == 0 {
		return []string{"default"}
	}
	return t.Tags
}
