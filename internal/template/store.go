package template

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/agentbox/agentbox/internal/crashpoint"
	"github.com/agentbox/agentbox/internal/destpolicy"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/untar"
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
//
// Templates belong to a team (Template.TeamID); every lookup names the team
// asking. There is no store-wide lock: a build, tag or delete locks the
// names it changes (per team), and garbage collection, an operator command,
// excludes only the layer commits of builds in flight (gc.go).
type Store struct {
	dir   string
	log   *slog.Logger
	locks keyedMutex
	// fetch carries every request a build makes to a host its input
	// names (registry pulls): the destination policy's transport, the
	// package's only way out to such hosts.
	fetch  http.RoundTripper
	unpack untar.Limits // image layers
	// self is the server's binary, which runs the confined unpacker
	// (`self __hook unpack`); a test binary must dispatch that hook.
	self     string
	uploads  uploadLedger      // uploads.go
	disk     DiskGuard         // nil: not guarded (diskguard.go)
	crash    crashpoint.Switch // test crash points (crash.go)
	instance string            // names this server's upload part files (crash.go)
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
	if err := privateStore(abs); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("template store: own binary, for the confined unpacker: %w", err)
	}
	return &Store{dir: abs, log: log.With("component", "template"), fetch: destpolicy.New(destpolicy.Config{}).Transport(), self: self}, nil
}

// unpackArchive is how the store unpacks an archive a tenant wrote (an
// image layer, an uploaded build context): confined, in a child (see
// UnpackHook), never in the server's own process.
func (s *Store) unpackArchive(ctx context.Context, r io.Reader, dir string, lim untar.Limits) (unpackStats, error) {
	return confinedUnpack(ctx, s.self, r, dir, lim)
}

// SetFetchPolicy sets the destination policy of the registry pulls builds
// make (the default refuses every private, loopback, link-local and host
// address and allows nothing more). Call it before builds start.
func (s *Store) SetFetchPolicy(p *destpolicy.Policy) { s.fetch = p.Transport() }

// SetUnpackLimits sets the limits image layers unpack within (zero fields:
// the defaults). Call it before builds start.
func (s *Store) SetUnpackLimits(l untar.Limits) { s.unpack = l }

// privateStore creates dir and keeps other host users out of it: the
// directory may be searched, not listed (0711, so a build's sandbox, whose
// mapped root is an unprivileged host uid, can reach its own work dir by
// its unguessable name), each template's directory is 0700 and its
// metadata 0600. It also tightens what an older version made wider; the
// contents of a rootfs keep their modes (they are the sandbox's files).
func privateStore(dir string) error {
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return fmt.Errorf("template dir: %w", err)
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		return fmt.Errorf("template dir %s: make private: %w", dir, err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("template dir: %w", err)
	}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		switch {
		case e.Name() == lockFile:
			err = os.Chmod(p, 0o600)
		case e.IsDir() && validID(e.Name()):
			if err = os.Chmod(p, 0o700); err == nil {
				if err = os.Chmod(filepath.Join(p, metaFile), 0o600); errors.Is(err, fs.ErrNotExist) {
					err = nil
				}
			}
		}
		if err != nil {
			return fmt.Errorf("template dir: make %s private: %w", p, err)
		}
	}
	return nil
}

// Dir is the directory the store keeps templates in.
func (s *Store) Dir() string { return s.dir }

// Get resolves ref for team: a template ID, an alias, or "alias:tag".
// Names resolve among the team's own templates first, then among the
// builtins and public templates; another team's template is ErrNotFound,
// as if it did not exist. Without a tag, or with the tags "default" and
// "latest", the newest template carrying the alias wins; any other tag must
// be one the template was built with. team "" (the operator's internal
// lookups: warm pools, the base check at start) sees builtins and public
// templates only.
func (s *Store) Get(ctx context.Context, team, ref string) (*Template, error) {
	name, tag, _ := strings.Cut(ref, ":")
	if name == "" {
		return nil, fmt.Errorf("template %q: %w", ref, errdefs.ErrNotFound)
	}
	if validID(name) {
		t, err := s.load(name)
		if err == nil && t.VisibleTo(team) {
			return t, nil
		}
		if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return nil, err
		}
	}
	all, err := s.listAll(ctx)
	if err != nil {
		return nil, err
	}
	anyTag := tag == "" || tag == "default" || tag == "latest"
	match := func(t *Template) bool {
		return slices.Contains(t.Aliases, name) && (anyTag || slices.Contains(t.Tags, tag))
	}
	for _, t := range all { // newest first
		if t.OwnedBy(team) && match(t) {
			return t, nil
		}
	}
	for _, t := range all {
		if (t.Builtin() || t.Public) && match(t) {
			return t, nil
		}
	}
	return nil, fmt.Errorf("template %q: %w", ref, errdefs.ErrNotFound)
}

// GetOwned resolves ref like Get and also requires team to own the
// template: what build-over, tag, untag and delete need. A builtin or public
// template is refused with a reason; another team's is ErrNotFound.
func (s *Store) GetOwned(ctx context.Context, team, ref string) (*Template, error) {
	t, err := s.Get(ctx, team, ref)
	if err != nil {
		return nil, err
	}
	if !t.OwnedBy(team) {
		return nil, fmt.Errorf("template %q is a builtin or public template of the server: only its owner (the operator) can change or delete it: %w", ref, errdefs.ErrInvalidArgument)
	}
	return t, nil
}

// List returns the templates team may use (its own, the builtins and the
// public ones), newest first.
func (s *Store) List(ctx context.Context, team string) ([]*Template, error) {
	all, err := s.listAll(ctx)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(all, func(t *Template) bool { return !t.VisibleTo(team) }), nil
}

// ListAll returns every template of every team, newest first: the
// operator's view (`agentbox template usage`).
func (s *Store) ListAll(ctx context.Context) ([]*Template, error) { return s.listAll(ctx) }

// listAll returns every built template, newest first. Unreadable entries
// are logged and skipped so one broken template does not hide the others.
func (s *Store) listAll(ctx context.Context) ([]*Template, error) {
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

// Delete removes team's template ref (ID or name). Sandboxes still running
// on it keep their open files, but new ones cannot start from it.
func (s *Store) Delete(ctx context.Context, team, ref string) error {
	t, err := s.GetOwned(ctx, team, ref)
	if err != nil {
		return err
	}
	return s.remove(ctx, t.ID)
}

// Remove deletes template id whoever owns it: the operator's command.
func (s *Store) Remove(ctx context.Context, id string) error {
	if _, err := s.load(id); err != nil {
		return err
	}
	return s.remove(ctx, id)
}

func (s *Store) remove(ctx context.Context, id string) error {
	unlock := s.locks.lock("template/" + id)
	defer unlock()
	dir := filepath.Join(s.dir, id)
	if _, err := os.Stat(filepath.Join(dir, metaFile)); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("template %q: %w", id, errdefs.ErrNotFound)
		}
		return fmt.Errorf("template %s: %w", id, err)
	}
	// A template built before the layer store keeps its rootfs in its own
	// dir; templates built on top of it reference that dir.
	if all, err := s.listAll(ctx); err == nil {
		var owner string
		for _, o := range all {
			if o.ID == id {
				owner = o.TeamID
			}
		}
		for _, o := range all {
			if o.ID != id && slices.Contains(o.LayerIDs, id) {
				if o.TeamID != owner {
					// Another team's template: its id is that team's to know.
					return fmt.Errorf("template %s is the base of a template of another team; it stays until that one is deleted: %w", id, errdefs.ErrConflict)
				}
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

// SetPublic marks template id public (usable by every team) or private
// again: the operator's `agentbox template publish|unpublish`. Only the
// flag changes; owner, names and tags stay.
func (s *Store) SetPublic(ctx context.Context, id string, public bool) (*Template, error) {
	unlock := s.locks.lock("template/" + id)
	defer unlock()
	t, err := s.load(id)
	if err != nil {
		return nil, err
	}
	t.Public = public
	if err := writeMeta(filepath.Join(s.dir, id), t); err != nil {
		return nil, err
	}
	s.log.InfoContext(ctx, "template visibility changed", "id", id, "public", public)
	return t, nil
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
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
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

// keyedMutex hands out one mutex per key (a template ID, a team's name), so
// work on one template or team never waits for another's.
type keyedMutex struct {
	mu    sync.Mutex
	locks map[string]*keyedLock
}

type keyedLock struct {
	mu   sync.Mutex
	refs int
}

func (k *keyedMutex) lock(key string) (unlock func()) {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = map[string]*keyedLock{}
	}
	l := k.locks[key]
	if l == nil {
		l = &keyedLock{}
		k.locks[key] = l
	}
	l.refs++
	k.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		k.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(k.locks, key)
		}
		k.mu.Unlock()
	}
}

func randomSuffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
