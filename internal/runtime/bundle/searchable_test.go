package bundle

import (
	"os"
	"path/filepath"
	"testing"
)

// TestEnsureSearchableBy: a directory the reader owns (and may search)
// stays closed to others; any other gets o+x, never o+r.
func TestEnsureSearchableBy(t *testing.T) {
	for _, tc := range []struct {
		name string
		uid  int
		want os.FileMode
	}{
		{"the owner reads", os.Getuid(), 0o700},
		{"another uid reads", os.Getuid() + 1, 0o701},
		{"anyone reads", -1, 0o701},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "bundle")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := EnsureSearchableBy(dir, tc.uid); err != nil {
				t.Fatal(err)
			}
			fi, err := os.Stat(dir)
			if err != nil {
				t.Fatal(err)
			}
			if got := fi.Mode().Perm(); got != tc.want {
				t.Errorf("mode %o, want %o", got, tc.want)
			}
		})
	}
}
