package microvm

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestSnapshotLayers(t *testing.T) {
	dir := t.TempDir()
	mk := func(name string, disk bool) string {
		p := filepath.Join(dir, name)
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if disk {
			if err := os.WriteFile(filepath.Join(p, diskFile), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return p
	}
	base, app, snapA, snapB := mk("base", false), mk("app", false), mk("a", true), mk("b", true)
	for _, tc := range []struct {
		name     string
		layers   []string
		wantRoot []string
		wantDisk string
	}{
		{"snapshot of a template sandbox", []string{base, app, snapA}, []string{base, app}, snapA},
		{"snapshot of a sandbox from a snapshot", []string{base, snapA, snapB}, []string{base}, snapB},
		{"no disk last", []string{base, snapA, app}, []string{base, app}, ""},
		{"template only", []string{base}, []string{base}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root, disk := snapshotLayers(tc.layers)
			if !slices.Equal(root, tc.wantRoot) || disk != tc.wantDisk {
				t.Errorf("snapshotLayers = %q, %q; want %q, %q", root, disk, tc.wantRoot, tc.wantDisk)
			}
		})
	}
}

func TestEmptyRootStaysEmpty(t *testing.T) {
	d := &Driver{cfg: Config{RunDir: t.TempDir()}}
	dir, err := d.emptyRoot()
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o555 {
		t.Fatalf("QEMU's root %s: %v %v, want mode 0555", dir, fi.Mode(), err)
	}
	if err := os.WriteFile(filepath.Join(dir, "x"), nil, 0o600); err == nil {
		if _, err := d.emptyRoot(); err == nil {
			t.Fatal("a QEMU root with a file in it was accepted")
		}
	}
}
