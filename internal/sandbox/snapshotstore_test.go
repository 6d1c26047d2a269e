package sandbox

import (
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/hostkey"
)

// TestSnapshotDirsHideIDs: a new snapshot's directory (whose path is an
// overlay lower dir and a checkpoint tool's argument, both readable by
// every host user) is its opaque key; one an earlier version named by the
// id is still found under that name.
func TestSnapshotDirsHideIDs(t *testing.T) {
	dir := t.TempDir()
	st, err := openSnapshotStore(dir, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, snap Snapshot) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(dir, name), 0o700); err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(snap)
		if err := os.WriteFile(filepath.Join(dir, name, snapshotMeta), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	const fresh, legacy, stray = "snapfresh0000000001", "snaplegacy000000001", "snapstray0000000001"
	for _, p := range []string{st.path(fresh), st.tmpPath(fresh), st.image(fresh)} {
		if strings.Contains(p, fresh) {
			t.Errorf("%s names the snapshot id", p)
		}
	}
	if name := filepath.Base(st.path(fresh)); !hostkey.IsKey(name) {
		t.Errorf("new snapshot dir %q is not a key", name)
	}
	write(filepath.Base(st.path(fresh)), Snapshot{ID: fresh, TeamID: "t"})
	write(legacy, Snapshot{ID: legacy, TeamID: "t"})
	// A dir whose record names another snapshot is nobody's.
	write(filepath.Base(st.path(legacy+"x")), Snapshot{ID: stray, TeamID: "t"})

	if got := st.path(legacy); got != filepath.Join(dir, legacy) {
		t.Errorf("legacy snapshot at %s, want its old dir", got)
	}
	for _, id := range []string{fresh, legacy} {
		if snap, err := st.load(id); err != nil || snap.ID != id {
			t.Errorf("load %s: %v %v", id, snap, err)
		}
	}
	for _, id := range []string{stray, filepath.Base(st.path(fresh))} {
		if _, err := st.load(id); err == nil {
			t.Errorf("load %s: found", id)
		}
	}
	var ids []string
	for _, s := range st.list(true) {
		ids = append(ids, s.ID)
	}
	if len(ids) != 2 {
		t.Errorf("list = %v, want %s and %s", ids, fresh, legacy)
	}
	if id, ok := st.dirOf(filepath.Base(st.path(fresh))); !ok || id != fresh {
		t.Errorf("dirOf = %q %v", id, ok)
	}
}

// TestSnapshotLayersSealedOnOpen: layers an earlier version left readable
// by others are closed when the store opens.
func TestSnapshotLayersSealedOnOpen(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"snapold000000000001/upper", "snapold000000000001/base-0", "snapold000000000001/image"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := openSnapshotStore(dir, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	for d, want := range map[string]os.FileMode{"upper": 0o700, "base-0": 0o700, "image": 0o755} {
		fi, err := os.Stat(filepath.Join(dir, "snapold000000000001", d))
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got != want {
			t.Errorf("%s: mode %o, want %o", d, got, want)
		}
	}
}
