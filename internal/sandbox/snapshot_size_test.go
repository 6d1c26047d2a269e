package sandbox

import (
	"os"
	"path/filepath"
	"testing"
)

// TestDirSizeCountsStoredBytes: a sparse disk copy counts what the host
// stores, not its apparent size.
func TestDirSizeCountsStoredBytes(t *testing.T) {
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, "disk.img"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1 << 30); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(make([]byte, 1<<20), 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "small"), []byte("ten bytes!"), 0o600); err != nil {
		t.Fatal(err)
	}
	got := dirSize(dir)
	if got < 1<<20 || got > 2<<20 {
		t.Errorf("dirSize = %d, want about 1 MiB (written) + 10 bytes, not the 1 GiB apparent size", got)
	}
}
