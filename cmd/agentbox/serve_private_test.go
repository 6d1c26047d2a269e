package main

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestPrivateDataDir: what an older version left readable in the data dir
// is tightened; a symlinked apikey is refused rather than followed.
func TestPrivateDataDir(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	dir := filepath.Join(t.TempDir(), "data")
	for _, d := range []string{dir, filepath.Join(dir, "snapshots")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "apikey"), []byte("e2b_x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := privateDataDir(dir); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]os.FileMode{"": 0o700, "apikey": 0o600, "snapshots": 0o700} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%q: mode %v, want %v", name, fi.Mode().Perm(), want)
		}
	}
	// A fresh data dir is created private.
	fresh := filepath.Join(t.TempDir(), "fresh", "data")
	if err := privateDataDir(fresh); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(fresh); fi.Mode().Perm() != 0o700 {
		t.Errorf("fresh data dir mode %v, want 0700", fi.Mode().Perm())
	}
	// A symlink planted as apikey is refused.
	os.Remove(filepath.Join(dir, "apikey"))
	if err := os.Symlink("/etc/shadow", filepath.Join(dir, "apikey")); err != nil {
		t.Fatal(err)
	}
	if err := privateDataDir(dir); err == nil {
		t.Error("a symlinked apikey was accepted")
	}
}
