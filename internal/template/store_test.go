package template

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/testutil"
)

func TestDefinitionID(t *testing.T) {
	a := Definition{Name: "x", Packages: []string{"curl", "bash"}}
	b := Definition{Name: "x", Packages: []string{"bash", "curl", "bash"}, Suite: DefaultSuite, CPUCount: DefaultCPUCount}
	c := Definition{Name: "x", Packages: []string{"bash"}}
	idA, err := a.ID()
	if err != nil {
		t.Fatal(err)
	}
	idB, _ := b.ID()
	idC, _ := c.ID()
	if idA != idB {
		t.Errorf("same definition after defaults and sorting: %s != %s", idA, idB)
	}
	if idA == idC {
		t.Errorf("different packages hash to the same id %s", idA)
	}
	if len(idA) != 20 || idA[0] != 't' {
		t.Errorf("id %q: want t + 19 hex digits", idA)
	}
}

func TestDefinitionInvalid(t *testing.T) {
	for _, d := range []Definition{
		{Name: ""},
		{Name: "Base"},
		{Name: "../x"},
		{Name: "x", Packages: []string{"bash;rm"}},
		{Name: "x", DefaultUser: "root:0"},
		{Name: "x", DefaultWorkdir: "relative"},
		{Name: "x", MemoryMB: -1},
	} {
		if _, err := d.ID(); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%+v: got %v, want ErrInvalidArgument", d, err)
		}
	}
}

func TestBuiltinBase(t *testing.T) {
	base, ok := BuiltinDefinitions()["base"]
	if !ok {
		t.Fatal("no builtin base")
	}
	id, err := base.ID()
	if err != nil {
		t.Fatal(err)
	}
	// New Definition fields must stay out of the hash when unset, or every
	// existing base build would be rebuilt. (Changed on purpose with the
	// login profile's edit, profileWithoutID.)
	if id != "t2dbc0af87d89b134486" {
		t.Errorf("base template id changed to %s", id)
	}
	for _, name := range []string{"browser", "desktop"} {
		d, ok := BuiltinDefinitions()[name]
		// browser starts Chromium; desktop starts nothing, as
		// @e2b/desktop starts the display and would find it taken.
		starts := name == "browser"
		if !ok || (d.StartCmd != "") != starts || (d.ReadyCmd != "") != starts {
			t.Errorf("builtin %s: %+v", name, d)
			continue
		}
		if _, err := d.ID(); err != nil {
			t.Errorf("builtin %s: %v", name, err)
		}
	}
}

func TestStoreEmpty(t *testing.T) {
	s, err := NewStore(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, ref := range []string{"base", "tdeadbeef", "base:default", "../etc", ""} {
		_, err := s.Get(ctx, "team-a", ref)
		if !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("Get(%q) = %v, want ErrNotFound", ref, err)
		}
		if ref != "" && !strings.Contains(err.Error(), ref) {
			t.Errorf("Get(%q) error %q does not name the ref", ref, err)
		}
	}
	if err := s.Delete(ctx, "team-a", "tnope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Delete unknown = %v, want ErrNotFound", err)
	}
	list, err := s.List(ctx, "team-a")
	if err != nil || len(list) != 0 {
		t.Errorf("List = %v, %v; want empty", list, err)
	}
}

// TestBuild runs a real (small) mmdebstrap build; it takes about a minute.
func TestBuild(t *testing.T) {
	testutil.RequireRoot(t)
	if testing.Short() {
		t.Skip("mmdebstrap build in -short mode")
	}
	dir := t.TempDir()
	// A crashed earlier build leaves a work dir (no held lease); GC clears it.
	stale := filepath.Join(dir, buildPrefix+"tcrashed-0000")
	if err := os.MkdirAll(filepath.Join(stale, "rootfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	s, err := NewStore(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	def := Definition{Name: "tiny", Packages: []string{"bash", "coreutils", "sudo"}, Env: map[string]string{"FOO": "bar"}}
	var out bytes.Buffer
	tpl, err := s.Build(ctx, def, nil, &out)
	if err != nil {
		t.Fatalf("build: %v\n%s", err, out.String())
	}
	if _, err := s.GC(ctx); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "built tiny ("+tpl.ID+")") {
		t.Errorf("progress lacks the summary line:\n%s", out.String())
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale build dir survived: %v", err)
	}

	rootfs := filepath.Join(dir, tpl.ID, "rootfs")
	if len(tpl.Layers) != 1 || tpl.Layers[0] != rootfs {
		t.Errorf("Layers = %v, want [%s]", tpl.Layers, rootfs)
	}
	passwd, err := os.ReadFile(filepath.Join(rootfs, "etc/passwd"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(passwd), "user:x:1000:1000::/home/user:/bin/bash") {
		t.Errorf("user missing from passwd:\n%s", passwd)
	}
	group, _ := os.ReadFile(filepath.Join(rootfs, "etc/group"))
	if !strings.Contains(string(group), "sudo:x:27:user") {
		t.Errorf("user not in sudo group:\n%s", group)
	}
	st, err := os.Stat(filepath.Join(rootfs, "etc/sudoers.d/user"))
	if err != nil || st.Mode().Perm() != 0o440 {
		t.Errorf("sudoers file: %v %v", st, err)
	}
	if st, err := os.Stat(filepath.Join(rootfs, "home/user")); err != nil || !st.IsDir() {
		t.Errorf("home dir: %v", err)
	}
	if tpl.SizeBytes <= 0 || tpl.BuildSeconds <= 0 || tpl.CreatedAt.IsZero() {
		t.Errorf("build figures not set: %+v", tpl)
	}

	// template.json round-trips through Get by id, alias and alias:tag.
	for _, ref := range []string{tpl.ID, "tiny", "tiny:default"} {
		got, err := s.Get(ctx, "", ref)
		if err != nil {
			t.Fatalf("Get(%q): %v", ref, err)
		}
		a, _ := json.Marshal(got)
		b, _ := json.Marshal(tpl)
		if !bytes.Equal(a, b) || got.Layers[0] != rootfs {
			t.Errorf("Get(%q) = %s, want %s", ref, a, b)
		}
	}
	list, err := s.List(ctx, "any-team")
	if err != nil || len(list) != 1 || list[0].ID != tpl.ID {
		t.Errorf("List = %v, %v", list, err)
	}

	// Same definition again: a cache hit, no build.
	out.Reset()
	again, err := s.Build(ctx, def, nil, &out)
	if err != nil {
		t.Fatal(err)
	}
	if again.ID != tpl.ID || !again.CreatedAt.Equal(tpl.CreatedAt) || !strings.Contains(out.String(), "cached") {
		t.Errorf("second build was not a cache hit: %+v\n%s", again, out.String())
	}

	// A builtin is the operator's: a team cannot delete it.
	if err := s.Delete(ctx, "team-a", tpl.ID); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("team Delete of a builtin = %v", err)
	}
	if err := s.Remove(ctx, tpl.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "", "tiny"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Get after Delete = %v", err)
	}
	if err := s.Remove(ctx, tpl.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("second Delete = %v", err)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if e.Name() != lockFile && e.Name() != gcLockFile {
			t.Errorf("left behind: %s", e.Name())
		}
	}
}

// TestStoreIsPrivate: an older version's world-readable store is tightened
// on open (template dirs 0700, metadata 0600, the store dir searchable but
// not listable), and what the store writes later is private too. The
// files of a template's rootfs keep their modes.
func TestStoreIsPrivate(t *testing.T) {
	dir := t.TempDir()
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	// What an older version left: 0755 dirs, 0644 metadata and lock.
	tdir := filepath.Join(dir, "abc123")
	for _, d := range []string{dir, tdir, filepath.Join(tdir, rootfsDir, "etc")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		_ = os.Chmod(d, 0o755)
	}
	for _, f := range []string{filepath.Join(tdir, metaFile), filepath.Join(dir, lockFile), filepath.Join(tdir, rootfsDir, "etc", "hostname")} {
		if err := os.WriteFile(f, []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s, err := NewStore(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeMeta(tdir, &Template{ID: "abc123"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.lockDir(context.Background()); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]os.FileMode{
		dir:                           0o711,
		tdir:                          0o700,
		filepath.Join(tdir, metaFile): 0o600,
		filepath.Join(dir, lockFile):  0o600,
		filepath.Join(tdir, rootfsDir, "etc", "hostname"): 0o644, // the sandbox's file
	} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", path, fi.Mode().Perm(), want)
		}
	}
}

// TestDeleteBaseOfOtherTeam: a legacy template another team built on stays,
// and the refusal does not name the other team's template.
func TestDeleteBaseOfOtherTeam(t *testing.T) {
	dir := t.TempDir()
	write := func(tpl Template) {
		t.Helper()
		b, err := json.Marshal(tpl)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(dir, tpl.ID, rootfsDir), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, tpl.ID, metaFile), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(Template{ID: "tlegacy", TeamID: "team-a", LayerIDs: []string{"tlegacy"}})
	write(Template{ID: "tchildofb", TeamID: "team-b", LayerIDs: []string{"tlegacy"}})
	s, err := NewStore(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	err = s.Delete(ctx, "team-a", "tlegacy")
	if !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("Delete = %v, want ErrConflict", err)
	}
	if strings.Contains(err.Error(), "tchildofb") {
		t.Errorf("refusal names another team's template: %v", err)
	}
	if err := s.Remove(ctx, "tchildofb"); err != nil {
		t.Fatal(err)
	}
	write(Template{ID: "tchildofa", TeamID: "team-a", LayerIDs: []string{"tlegacy"}})
	err = s.Delete(ctx, "team-a", "tlegacy")
	if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "tchildofa") {
		t.Errorf("Delete = %v, want a conflict naming the team's own tchildofa", err)
	}
}
