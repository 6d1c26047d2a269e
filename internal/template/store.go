package template

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/agentbox/agentbox/internal/errdefs"
)

const (
	metaFile  = "template.json"
	rootfsDir = "rootfs"
	// Work dirs of builds and deletes start with a dot so they never look
	// like a template.
	buildPrefix = ".build-"
	trashPrefix = ".trash-"
	lockFile    = ".lock"
)

// Store keeps built templates on disk, one directory per template:
// <dir>/<id>/rootfs and <dir>/<id>/template.json. It reads the disk on every
// lookup, so templates built by another process (the CLI) show up at once.
type Store struct {
	dir string
	log *slog.Logger
	mu  sync.Mutex // serializes builds and deletes within this process
}

// NewStore opens (creating if needed) the template directory dir.
func NewStore(dir string, log *slog.Logger) (*Store, error) {
	if dir == "" {
		return nil, fmt.Errorf("template dir: empty path: %w", errdefs.ErrInvalidArgument)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("template dir %s: %w", dir, err)
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return nil, fmt.Errorf("template dir: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Store{dir: abs, log: log.With("component", "template")}, nil
}

// Dir is the directory the store keeps templates in.
func (s *Store) Dir() string { return s.dir }

// Get resolves ref: a template ID, an alias, or "alias:tag". Without a tag,
// or with the tags "default" and "latest", the newest template carrying the
// alias wins; any other tag must be one the template was built with.
func (s *Store) Get(ctx context.Context, ref string) (*Template, error) {
	name, tag, _ := strings.Cut(ref, ":")
	if name == "" {
		return nil, fmt.Errorf("template %q: %w", ref, errdefs.ErrNotFound)
	}
	if validID(name) {
		t, err := s.load(name)
		if err == nil {
			return t, nil
		}
		if !errors.Is(err, errdefs.ErrNotFound) {
			return nil, err
		}
	}
	all, err := s.List(ctx)
	if err != nil {
		return nil, err
	}
	anyTag := tag == "" || tag == "default" || tag == "latest"
	for _, t := range all { // newest first
		if slices.Contains(t.Aliases, name) && (anyTag || slices.Contains(t.Tags, tag)) {
			return t, nil
		}
	}
	return nil, fmt.Errorf("template %q: %w", ref, errdefs.ErrNotFound)
}

// List returns every built template, newest first. Unreadable entries are
// logged and skipped so one broken template does not hide the others.
func (s *Store) List(ctx context.Context) ([]*Template, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("list templates: %w", err)
	}
	var out []*Template
	for _, e := range entries {
		if !e.IsDir() || !validID(e.Name()) {
			continue
		}
		t, err := s.load(e.Name())
		if err != nil {
			if !errors.Is(err, errdefs.ErrNotFound) {
				s.log.WarnContext(ctx, "skipping unreadable template", "id", e.Name(), "err", err)
			}
			continue
		}
		out = append(out, t)
	}
	slices.SortFunc(out, func(a, b *Template) int {
		return cmp.Or(b.CreatedAt.Compare(a.CreatedAt), strings.Compare(a.ID, b.ID))
	})
	return out, nil
}

// Delete removes the template with ID id. Sandboxes still running on it keep
// their open files, but new ones cannot start from it.
func (s *Store) Delete(ctx context.Context, id string) error {
	if !validID(id) {
		return fmt.Errorf("template %q: %w", id, errdefs.ErrNotFound)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	dir := filepath.Join(s.dir, id)
	if _, err := os.Stat(filepath.Join(dir, metaFile)); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("template %q: %w", id, errdefs.ErrNotFound)
		}
		return fmt.Errorf("template %s: %w", id, err)
	}
	// A template built before the layer store keeps its rootfs in its own
	// dir; templates built on top of it reference that dir.
	if all, err := s.List(ctx); err == nil {
		for _, o := range all {
			if o.ID != id && slices.Contains(o.LayerIDs, id) {
				return fmt.Errorf("template %s is the base of template %s; delete that first: %w", id, o.ID, errdefs.ErrConflict)
			}
		}
	}
	// Rename first so a crash mid-removal never leaves a half template
	// that still looks valid. Layers in the layer store stay until GC.
	trash := filepath.Join(s.dir, trashPrefix+id+"-"+randomSuffix())
	if err := os.Rename(dir, trash); err != nil {
		return fmt.Errorf("delete template %s: %w", id, err)
	}
	if err := removeTree(trash); err != nil {
		s.log.WarnContext(ctx, "template removal incomplete", "id", id, "dir", trash, "err", err)
	}
	s.log.InfoContext(ctx, "template deleted", "id", id)
	return nil
}

func (s *Store) load(id string) (*Template, error) {
	dir := filepath.Join(s.dir, id)
	b, err := os.ReadFile(filepath.Join(dir, metaFile))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("template %q: %w", id, errdefs.ErrNotFound)
		}
		return nil, fmt.Errorf("template %s: %w", id, err)
	}
	var t Template
	if err := json.Unmarshal(b, &t); err != nil {
		return nil, fmt.Errorf("template %s: decode %s: %w", id, metaFile, err)
	}
	if t.ID != id {
		return nil, fmt.Errorf("template %s: %s names id %q", id, metaFile, t.ID)
	}
	t.Layers = nil
	for _, ref := range t.LayerIDs {
		p, err := s.layerRefPath(ref)
		if err != nil {
			return nil, fmt.Errorf("template %s: %w", id, err)
		}
		t.Layers = append(t.Layers, p)
	}
	if len(t.LayerIDs) == 0 {
		t.Layers = []string{filepath.Join(dir, rootfsDir)}
	}
	return &t, nil
}

func writeMeta(dir string, t *Template) error {
	b, err := json.MarshalIndent(t, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", metaFile, err)
	}
	tmp := filepath.Join(dir, metaFile+".tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, metaFile))
}

// validID accepts names that are safe as a single path element and are not
// one of the store's work dirs.
func validID(id string) bool {
	return id != "" && len(id) <= 128 && !strings.HasPrefix(id, ".") &&
		!strings.ContainsAny(id, `/\:`) && filepath.IsLocal(id)
}

func randomSuffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
