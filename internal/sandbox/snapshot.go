package sandbox

import (
	"context"
	"crypto/rand"
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
	"syscall"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/hostkey"
)

// Snapshot is a persistent image of a sandbox: its template's layers plus
// the writable layer captured at checkpoint time, and its memory. New
// sandboxes start from it with templateID = its id (or name).
type Snapshot struct {
	ID             string            `json:"id"`
	Name           string            `json:"name,omitempty"`
	TeamID         string            `json:"teamID"`
	SandboxID      string            `json:"sandboxID"`
	TemplateID     string            `json:"templateID"`
	Alias          string            `json:"alias,omitempty"`
	Layers         []string          `json:"layers"` // lowest first; the last is this snapshot's upper
	CPUCount       int               `json:"cpuCount"`
	MemoryMB       int               `json:"memoryMB"`
	DiskMB         int               `json:"diskMB"`
	PIDs           int               `json:"pids,omitempty"`
	TmpMB          int               `json:"tmpMB,omitempty"` // the /tmp mount must match the image's
	Isolation      string            `json:"isolation,omitempty"`
	VolumeMounts   []VolumeMount     `json:"volumeMounts,omitempty"` // mounted again by its sandboxes
	DefaultUser    string            `json:"defaultUser"`
	DefaultWorkdir string            `json:"defaultWorkdir"`
	EnvVars        map[string]string `json:"envVars,omitempty"`
	Secure         bool              `json:"secure"` // the memory holds the source's envd token
	AllowInternet  bool              `json:"allowInternet"`
	Hidden         bool              `json:"hidden,omitempty"` // made for a fork; removed with its last sandbox
	CreatedAt      time.Time         `json:"createdAt"`
	SizeBytes      int64             `json:"sizeBytes"`
	// FilesystemOnly: no memory; sandboxes made from it boot fresh on its
	// layers (processes start anew).
	FilesystemOnly bool `json:"filesystemOnly,omitempty"`
	// BootID is the source's boot, which a memory image keeps.
	BootID string `json:"bootID,omitempty"`
}

// SnapshotRef is the E2B name of a snapshot: "<name or id>:default".
func (s *Snapshot) SnapshotRef() string {
	if s.Name != "" {
		return s.Name + ":default"
	}
	return s.ID + ":default"
}

const (
	snapshotMeta   = "snapshot.json"
	snapshotTmp    = ".tmp-"
	snapshotGone   = "deleted" // marker: deleted by the user, removed once unused
	snapshotMinAge = 5 * time.Minute
)

// snapshotStore keeps snapshots on disk, one directory each. A snapshot
// appears by renaming a complete temporary directory, so a crash never
// leaves a half one that looks usable.
//
// A snapshot's directory is named by its opaque host key (internal/hostkey),
// not its id: its layers are overlay lower dirs and idmapped mount sources
// of the sandboxes restored from it, and its image dir is an argument of
// the checkpoint tools, all of which every host user can read in /proc.
// Directories an earlier version named by the id keep that name.
type snapshotStore struct {
	dir  string
	keys hostkey.Keyer
	log  *slog.Logger
	mu   sync.Mutex
}

// snapshotKeySecret holds the store's key secret, in the private store dir.
const snapshotKeySecret = ".key-secret"

func openSnapshotStore(dir string, log *slog.Logger) (*snapshotStore, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("snapshot dir: %w", err)
	}
	// Snapshots hold memory images and file layers: no other host user may
	// list or read them, also when an older version made the dir wider.
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("snapshot dir: make private: %w", err)
	}
	keys, err := hostkey.Load(filepath.Join(dir, snapshotKeySecret))
	if err != nil {
		return nil, fmt.Errorf("snapshot dir: %w", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("snapshot dir: %w", err)
	}
	for _, e := range entries {
		switch {
		case strings.HasPrefix(e.Name(), snapshotTmp):
			log.Warn("removing incomplete snapshot", "dir", e.Name())
			_ = os.RemoveAll(filepath.Join(dir, e.Name()))
		case e.IsDir() && !strings.HasPrefix(e.Name(), "."):
			// Layers an earlier version left open to others.
			if err := sealLayers(filepath.Join(dir, e.Name())); err != nil {
				log.Warn("snapshot layers stay open to host users", "dir", e.Name(), "err", err)
			}
		}
	}
	return &snapshotStore{dir: dir, keys: keys, log: log}, nil
}

// path is snapshot id's directory: named by its key, or by the id itself
// when an earlier version made it.
func (s *snapshotStore) path(id string) string {
	if legacy := filepath.Join(s.dir, id); ValidID(id) {
		if _, err := os.Lstat(legacy); err == nil {
			return legacy
		}
	}
	return filepath.Join(s.dir, s.keys.Key(id))
}

// tmpPath is where snapshot id is assembled before it appears at path.
func (s *snapshotStore) tmpPath(id string) string {
	return filepath.Join(s.dir, snapshotTmp+s.keys.Key(id))
}

func (s *snapshotStore) image(id string) string {
	return filepath.Join(s.path(id), "image")
}

// dirOf names the snapshot whose directory (the first element of a path
// relative to the store) is name.
func (s *snapshotStore) dirOf(name string) (string, bool) {
	snap, err := s.loadDir(name)
	if err != nil {
		return "", false
	}
	return snap.ID, true
}

func (s *snapshotStore) load(id string) (*Snapshot, error) {
	if !ValidID(id) {
		return nil, fmt.Errorf("snapshot %q: %w", id, errdefs.ErrNotFound)
	}
	snap, err := s.loadDir(filepath.Base(s.path(id)))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("snapshot %q: %w", id, errdefs.ErrNotFound)
		}
		return nil, err
	}
	if snap.ID != id {
		return nil, fmt.Errorf("snapshot %q: %w", id, errdefs.ErrNotFound)
	}
	return snap, nil
}

// loadDir reads the snapshot in the store's directory name, which must be
// the one its id is kept in.
func (s *snapshotStore) loadDir(name string) (*Snapshot, error) {
	b, err := os.ReadFile(filepath.Join(s.dir, name, snapshotMeta))
	if err != nil {
		return nil, err
	}
	var snap Snapshot
	if err := json.Unmarshal(b, &snap); err != nil {
		return nil, fmt.Errorf("snapshot dir %s: %w", name, err)
	}
	if !ValidID(snap.ID) || filepath.Base(s.path(snap.ID)) != name {
		return nil, fmt.Errorf("snapshot dir %s: holds snapshot %q of another dir: %w", name, snap.ID, fs.ErrNotExist)
	}
	return &snap, nil
}

func (s *snapshotStore) deleted(id string) bool {
	_, err := os.Stat(filepath.Join(s.path(id), snapshotGone))
	return err == nil
}

// list returns every complete snapshot (deleted ones too when all), newest first.
func (s *snapshotStore) list(all bool) []*Snapshot {
	entries, _ := os.ReadDir(s.dir)
	var out []*Snapshot
	for _, e := range entries {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		snap, err := s.loadDir(e.Name())
		if err != nil || (!all && s.deleted(snap.ID)) {
			continue
		}
		out = append(out, snap)
	}
	slices.SortFunc(out, func(a, b *Snapshot) int { return b.CreatedAt.Compare(a.CreatedAt) })
	return out
}

// resolve finds the team's snapshot by id or name, with an optional
// ":tag" and "namespace/" (E2B shapes).
func (s *snapshotStore) resolve(teamID, ref string) (*Snapshot, bool) {
	ref, _, _ = strings.Cut(ref, ":")
	if i := strings.LastIndexByte(ref, '/'); i >= 0 {
		ref = ref[i+1:]
	}
	if ref == "" {
		return nil, false
	}
	if snap, err := s.load(ref); err == nil && snap.TeamID == teamID && !s.deleted(ref) {
		return snap, true
	}
	for _, snap := range s.list(false) {
		if snap.TeamID == teamID && snap.Name == ref {
			return snap, true
		}
	}
	return nil, false
}

func newSnapshotID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return "snap" + string(b)
}

// CreateSnapshot captures the team's running sandbox (memory and writable
// layer, one consistent instant while it is frozen) as a persistent
// snapshot. The sandbox keeps running, with the same id and lifetime.
func (t *Snapshotter) CreateSnapshot(ctx context.Context, teamID, id, name string) (*Snapshot, error) {
	return t.snapshot(ctx, teamID, id, name, false, true)
}

// sealLayers closes the captured layers of the snapshot in dir to every
// host user but their owner: restoring the image makes the snapshot's dir
// searchable by others (the restored tasks read the image as the sandbox's
// mapped root), and its layer paths are in every host user's mountinfo.
// The server reads the layers as root (overlay, idmapped mounts, copies).
func sealLayers(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if n := e.Name(); e.IsDir() && (n == "upper" || n == "upper.log" || strings.HasPrefix(n, "base-")) {
			if err := os.Chmod(filepath.Join(dir, n), 0o700); err != nil {
				return err
			}
		}
	}
	return nil
}

func dirSize(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				// What the host stores: sparse disk copies count their
				// written blocks, not their apparent size.
				if st, ok := info.Sys().(*syscall.Stat_t); ok {
					n += min(info.Size(), st.Blocks*512)
				} else {
					n += info.Size()
				}
			}
		}
		return nil
	})
	return n
}

// snapshots is the catalogue of the team snapshots in the snapshot store:
// lookups, deletion and the collection of what nothing uses any more. The
// store keeps its own lock; lastGC has this type's. The sandboxes that use
// a snapshot are the manager's records, read through recs, and their rows.
type snapshots struct {
	log   *slog.Logger
	store func() *snapshotStore // nil store: snapshots are off
	recs  records
	rows  rows

	mu     sync.Mutex
	lastGC time.Time
}

// ListSnapshots returns the team's snapshots, newest first, optionally of
// one sandbox or matching a name or id.
func (t *Snapshotter) ListSnapshots(ctx context.Context, teamID, sandboxID, name string) []*Snapshot {
	return t.snaps.list(teamID, sandboxID, name)
}

func (c *snapshots) list(teamID, sandboxID, name string) []*Snapshot {
	snaps := c.store()
	if snaps == nil {
		return nil
	}
	want := ""
	if name != "" {
		want, _, _ = strings.Cut(name, ":")
		if i := strings.LastIndexByte(want, '/'); i >= 0 {
			want = want[i+1:]
		}
	}
	var out []*Snapshot
	for _, s := range snaps.list(false) {
		if s.TeamID != teamID || s.Hidden || (sandboxID != "" && s.SandboxID != sandboxID) || (want != "" && s.Name != want && s.ID != want) {
			continue
		}
		out = append(out, s)
	}
	return out
}

// DeleteSnapshot deletes the team's snapshot. Sandboxes running on it keep
// its layer until they are gone; new ones cannot start from it.
func (t *Snapshotter) DeleteSnapshot(ctx context.Context, teamID, ref string) error {
	return t.snaps.delete(ctx, teamID, ref)
}

func (c *snapshots) delete(ctx context.Context, teamID, ref string) error {
	snaps := c.store()
	if snaps == nil {
		return fmt.Errorf("snapshot %q: %w", ref, errdefs.ErrNotFound)
	}
	snap, ok := snaps.resolve(teamID, ref)
	if !ok || snap.Hidden {
		return fmt.Errorf("snapshot %q: %w", ref, errdefs.ErrNotFound)
	}
	if err := os.WriteFile(filepath.Join(snaps.path(snap.ID), snapshotGone), nil, 0o600); err != nil {
		return err
	}
	c.mu.Lock()
	c.lastGC = time.Time{}
	c.mu.Unlock()
	c.tick(ctx)
	return nil
}

// IsSnapshot reports whether ref names one of the team's snapshots.
func (t *Snapshotter) IsSnapshot(teamID, ref string) bool {
	_, ok := t.snaps.team(teamID, ref)
	return ok
}

// tick removes deleted and fork snapshots nothing uses any more: no
// sandbox runs on them and no other snapshot is layered on them. It runs
// a pass at most every 30 seconds.
func (c *snapshots) tick(ctx context.Context) {
	if c.store() == nil {
		return
	}
	c.mu.Lock()
	if time.Since(c.lastGC) < 30*time.Second {
		c.mu.Unlock()
		return
	}
	c.lastGC = time.Now()
	c.mu.Unlock()
	c.gc(ctx, snapshotMinAge)
}

// inUse names the snapshots that a live or stored sandbox starts from.
func (c *snapshots) inUse(ctx context.Context) map[string]bool {
	used := map[string]bool{}
	c.recs.each(func(sb *Sandbox) {
		if sb.BaseSnapshot != "" {
			used[sb.BaseSnapshot] = true
		}
	})
	if recs, err := c.rows.st.ListSandboxes(ctx); err == nil {
		for _, r := range recs {
			var sb Sandbox
			if json.Unmarshal(r.Doc, &sb) == nil && sb.BaseSnapshot != "" {
				used[sb.BaseSnapshot] = true
			}
		}
	}
	return used
}

// gc is tick's pass; a fork snapshot younger than minAge may belong to a
// fork in flight and stays.
func (c *snapshots) gc(ctx context.Context, minAge time.Duration) {
	snaps := c.store()
	if snaps == nil {
		return
	}
	used := c.inUse(ctx)
	all := snaps.list(true)
	for _, s := range all {
		if snaps.deleted(s.ID) {
			continue
		}
		for _, l := range s.Layers[:len(s.Layers)-1] {
			// A moved image carries its base layers in its own dir: only
			// other snapshots' layers keep those snapshots.
			if rel, err := filepath.Rel(snaps.dir, l); err == nil && !strings.HasPrefix(rel, "..") {
				if owner, ok := snaps.dirOf(strings.Split(rel, string(filepath.Separator))[0]); ok && owner != s.ID {
					used[owner] = true
				}
			}
		}
	}
	for _, s := range all {
		if used[s.ID] || (!s.Hidden && !snaps.deleted(s.ID)) || time.Since(s.CreatedAt) < minAge && !snaps.deleted(s.ID) {
			continue
		}
		if err := os.RemoveAll(snaps.path(s.ID)); err != nil {
			c.log.Warn("remove snapshot", "snapshot", s.ID, "err", err)
			continue
		}
		c.log.Info("snapshot removed", "snapshot", s.ID, "hidden", s.Hidden)
	}
}

// team finds the team's snapshot that a create's templateID names.
// Another team's snapshot is not found, exactly like a missing one: the
// create then looks for a template of that name and fails as for any.
func (c *snapshots) team(teamID, ref string) (*Snapshot, bool) {
	snaps := c.store()
	if snaps == nil || teamID == poolTeam {
		return nil, false
	}
	return snaps.resolve(teamID, ref)
}

// ForkResult is one fork's outcome: a sandbox or the error that stopped it.
type ForkResult struct {
	Sandbox *Sandbox
	Err     error
}

// MaxForks is the most copies one fork call makes.
const MaxForks = 100
