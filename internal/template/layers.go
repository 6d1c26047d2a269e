package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

const (
	layersDir     = "layers"
	layerMetaFile = "layer.json"
	layerTmp      = ".tmp-"
)

// Layer describes one committed layer of the store.
type Layer struct {
	ID        string    `json:"id"`     // sha256 hex of the layer's content or build inputs
	Source    string    `json:"source"` // what made it, for humans
	SizeBytes int64     `json:"sizeBytes"`
	CreatedAt time.Time `json:"createdAt"`
}

// LayerKey hashes parts into a layer ID. Build steps use it to chain their
// inputs (the parent layer's ID, the instruction, the content it copies), so
// an unchanged step finds its layer again; image layers use their diff ID.
func LayerKey(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%d:%s\n", len(p), p)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func validLayerID(id string) bool {
	if len(id) != 64 {
		return false
	}
	_, err := hex.DecodeString(id)
	return err == nil && strings.ToLower(id) == id
}

func (s *Store) layersRoot() string { return filepath.Join(s.dir, layersDir) }

// LayerPath is the rootfs directory of layer id (which may not exist).
func (s *Store) LayerPath(id string) string {
	return filepath.Join(s.layersRoot(), id, rootfsDir)
}

// HasLayer reports whether layer id is committed.
func (s *Store) HasLayer(id string) bool {
	if !validLayerID(id) {
		return false
	}
	_, err := os.Stat(filepath.Join(s.layersRoot(), id, layerMetaFile))
	return err == nil
}

// layerRefPath resolves a Template.LayerIDs entry to a rootfs dir.
func (s *Store) layerRefPath(ref string) (string, error) {
	switch {
	case validLayerID(ref):
		return s.LayerPath(ref), nil
	case validID(ref):
		return filepath.Join(s.dir, ref, rootfsDir), nil
	}
	return "", fmt.Errorf("bad layer reference %q", ref)
}

// CreateLayer commits a new layer id whose content fill writes into rootfs
// (an empty directory). When the layer exists already it does nothing and
// reports cached. A failed fill leaves nothing behind. Layer directories
// are only reachable by root (0700 above them), so the setuid files and
// ownership inside can never be used by other host users.
func (s *Store) CreateLayer(ctx context.Context, id, source string, fill func(ctx context.Context, rootfs string) error) (cached bool, err error) {
	if !validLayerID(id) {
		return false, fmt.Errorf("layer id %q: want 64 lowercase hex digits", id)
	}
	if s.HasLayer(id) {
		return true, nil
	}
	tmp, release, err := s.newLayerWork(ctx, id)
	if err != nil {
		return false, err
	}
	defer release()
	defer func() {
		if err != nil {
			if rerr := removeTree(tmp); rerr != nil {
				s.log.WarnContext(ctx, "layer cleanup incomplete", "dir", tmp, "err", rerr)
			}
		}
	}()
	rootfs := filepath.Join(tmp, rootfsDir)
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return false, err
	}
	if err := fill(ctx, rootfs); err != nil {
		return false, err
	}
	// Shared: other builds commit beside this one; GC waits for the rename.
	unlock, err := s.gcLock(ctx, false)
	if err != nil {
		return false, err
	}
	defer unlock()
	return false, s.commitLayer(tmp, id, source)
}

// newLayerWork makes a fresh work dir for layer id inside the layer store
// (same filesystem, so committing is a rename), with a lock file held until
// release: GC leaves work dirs whose lock is held alone.
func (s *Store) newLayerWork(ctx context.Context, id string) (string, func(), error) {
	unlock, err := s.gcLock(ctx, false)
	if err != nil {
		return "", nil, err
	}
	defer unlock()
	if err := os.MkdirAll(s.layersRoot(), 0o700); err != nil {
		return "", nil, fmt.Errorf("layer store: %w", err)
	}
	// Keep layers out of reach of unprivileged host users, also when the
	// directory existed with a wider mode.
	if err := os.Chmod(s.layersRoot(), 0o700); err != nil {
		return "", nil, fmt.Errorf("layer store: %w", err)
	}
	tmp := filepath.Join(s.layersRoot(), layerTmp+id[:12]+"-"+randomSuffix())
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return "", nil, fmt.Errorf("layer store: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(tmp, leaseFile), os.O_CREATE|os.O_RDWR, 0o600)
	if err == nil {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	}
	if err != nil {
		if f != nil {
			f.Close()
		}
		_ = removeTree(tmp)
		return "", nil, fmt.Errorf("layer work lock: %w", err)
	}
	return tmp, func() { f.Close() }, nil
}

// commitLayer measures tmp/rootfs, writes the layer's metadata and renames
// tmp into place. Only tmp/rootfs and the metadata are kept.
func (s *Store) commitLayer(tmp, id, source string) error {
	entries, err := os.ReadDir(tmp)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.Name() != rootfsDir {
			if err := removeTree(filepath.Join(tmp, e.Name())); err != nil {
				return fmt.Errorf("layer %s: clean work dir: %w", id[:12], err)
			}
		}
	}
	size, err := diskUsage(filepath.Join(tmp, rootfsDir))
	if err != nil {
		return fmt.Errorf("layer %s: measure: %w", id[:12], err)
	}
	b, _ := json.MarshalIndent(Layer{ID: id, Source: source, SizeBytes: size, CreatedAt: time.Now().UTC()}, "", "  ")
	if err := os.WriteFile(filepath.Join(tmp, layerMetaFile), append(b, '\n'), 0o600); err != nil {
		return err
	}
	final := filepath.Join(s.layersRoot(), id)
	if err := os.Rename(tmp, final); err != nil {
		if s.HasLayer(id) { // committed concurrently: same content, keep theirs
			return removeTree(tmp)
		}
		return fmt.Errorf("layer %s: commit: %w", id[:12], err)
	}
	return nil
}

// ListLayers returns every committed layer.
func (s *Store) ListLayers(ctx context.Context) ([]Layer, error) {
	entries, err := os.ReadDir(s.layersRoot())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list layers: %w", err)
	}
	var out []Layer
	for _, e := range entries {
		if !validLayerID(e.Name()) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(s.layersRoot(), e.Name(), layerMetaFile))
		if err != nil {
			continue
		}
		var l Layer
		if json.Unmarshal(b, &l) == nil && l.ID == e.Name() {
			out = append(out, l)
		}
	}
	return out, nil
}

// Usage is the disk the store uses.
type Usage struct {
	Templates      int   `json:"templates"`
	Layers         int   `json:"layers"`
	LayerBytes     int64 `json:"layerBytes"`     // all committed layers
	UnusedLayers   int   `json:"unusedLayers"`   // layers GC would remove now
	UnusedBytes    int64 `json:"unusedBytes"`    // and the bytes it would free
	TemplateRootfs int64 `json:"templateRootfs"` // rootfs dirs of templates built before the layer store
}

// GCResult is what a garbage collection removed.
type GCResult struct {
	RemovedLayers []string `json:"removedLayers"`
	FreedBytes    int64    `json:"freedBytes"`
	Usage         Usage    `json:"usage"` // after the collection
}

// referenced returns the layer IDs some template (snapshots are templates)
// names, plus those an overlay mount on this host uses as a lower layer: a
// sandbox started from a template deleted since keeps its layers until it
// is gone.
func (s *Store) referenced(ctx context.Context) (map[string]bool, int, error) {
	ts, err := s.listAll(ctx)
	if err != nil {
		return nil, 0, err
	}
	refs := map[string]bool{}
	for _, t := range ts {
		for _, id := range t.LayerIDs {
			refs[id] = true
		}
	}
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		prefix := s.layersRoot() + "/"
		for line := range strings.Lines(string(b)) {
			for rest := line; ; {
				i := strings.Index(rest, prefix)
				if i < 0 {
					break
				}
				rest = rest[i+len(prefix):]
				if len(rest) >= 64 && validLayerID(rest[:64]) {
					refs[rest[:64]] = true
				}
			}
		}
	}
	return refs, len(ts), nil
}

// DiskUsage reports the store's disk use and what GC would free.
func (s *Store) DiskUsage(ctx context.Context) (Usage, error) {
	refs, n, err := s.referenced(ctx)
	if err != nil {
		return Usage{}, err
	}
	layers, err := s.ListLayers(ctx)
	if err != nil {
		return Usage{}, err
	}
	u := Usage{Templates: n, Layers: len(layers)}
	for _, l := range layers {
		u.LayerBytes += l.SizeBytes
		if !refs[l.ID] {
			u.UnusedLayers++
			u.UnusedBytes += l.SizeBytes
		}
	}
	ts, _ := s.listAll(ctx)
	for _, t := range ts {
		if len(t.LayerIDs) == 0 || slices.Contains(t.LayerIDs, t.ID) {
			u.TemplateRootfs += t.SizeBytes
		}
	}
	return u, nil
}

// GC removes every layer no template references, no build in flight holds
// (gc.go) and no mounted overlay uses, and leftovers of interrupted builds:
// the operator's `agentbox template gc`, across every team.
func (s *Store) GC(ctx context.Context) (GCResult, error) {
	unlock, err := s.gcLock(ctx, true)
	if err != nil {
		return GCResult{}, err
	}
	defer unlock()
	leased := s.liveLeases(ctx)
	refs, _, err := s.referenced(ctx)
	if err != nil {
		return GCResult{}, err
	}
	for id := range leased {
		refs[id] = true
	}
	layers, err := s.ListLayers(ctx)
	if err != nil {
		return GCResult{}, err
	}
	res := GCResult{RemovedLayers: []string{}}
	for _, l := range layers {
		if refs[l.ID] {
			continue
		}
		dir := filepath.Join(s.layersRoot(), l.ID)
		trash := filepath.Join(s.layersRoot(), layerTmp+"gc-"+l.ID[:12]+"-"+randomSuffix())
		if err := os.Rename(dir, trash); err != nil {
			return res, fmt.Errorf("gc layer %s: %w", l.ID[:12], err)
		}
		if err := removeTree(trash); err != nil {
			s.log.WarnContext(ctx, "layer removal incomplete", "dir", trash, "err", err)
		}
		res.RemovedLayers = append(res.RemovedLayers, l.ID)
		res.FreedBytes += l.SizeBytes
	}
	s.log.InfoContext(ctx, "template gc", "removed", len(res.RemovedLayers), "freed", res.FreedBytes)
	res.Usage, err = s.DiskUsage(ctx)
	return res, err
}
