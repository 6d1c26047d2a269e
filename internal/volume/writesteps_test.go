package volume

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// names lists dir's entries.
func names(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// cutReader fails after its bytes, as a client that goes away.
type cutReader struct{ n int }

func (c *cutReader) Read(p []byte) (int, error) {
	if c.n == 0 {
		return 0, io.ErrUnexpectedEOF
	}
	k := min(len(p), c.n)
	c.n -= k
	return k, nil
}

func TestWriteLeavesOnlyTheFile(t *testing.T) {
	for _, tc := range []struct {
		name  string
		force bool
		body  io.Reader
		want  string // the file afterwards; "" none
	}{
		{"new file", false, strings.NewReader("new"), "new"},
		{"replacement", true, strings.NewReader("new"), "new"},
		{"cut-off new file", false, &cutReader{n: 1 << 20}, ""},
		{"cut-off replacement", true, &cutReader{n: 1 << 20}, "old"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, dir, _ := files(t)
			if _, err := f.MakeDir("/sub", Meta{}, true); err != nil {
				t.Fatal(err)
			}
			if tc.force {
				if _, err := f.Write("/sub/a.txt", strings.NewReader("old"), Meta{}, false); err != nil {
					t.Fatal(err)
				}
			}
			_, err := f.Write("/sub/a.txt", tc.body, Meta{}, tc.force)
			got, rerr := os.ReadFile(filepath.Join(dir, "sub", "a.txt"))
			switch {
			case tc.want == "" && !errors.Is(rerr, os.ErrNotExist):
				t.Errorf("after a failed write (%v) the file is there: %q %v", err, got, rerr)
			case tc.want != "" && string(got) != tc.want:
				t.Errorf("file %q (%v), want %q (write: %v)", got, rerr, tc.want, err)
			}
			want := []string{"a.txt"}
			if tc.want == "" {
				want = nil
			}
			if n := names(t, filepath.Join(dir, "sub")); !slices.Equal(n, want) {
				t.Errorf("the directory holds %v, want %v", n, want)
			}
			if n := names(t, f.pending); len(n) != 0 {
				t.Errorf("records of writes left: %v", n)
			}
		})
	}
}

// A crash between staging and publishing leaves a hidden name and its
// record; removeStaged (Reconcile) removes both, and only a record whose
// write was published.
func TestRemoveStaged(t *testing.T) {
	f, dir, secret := files(t)
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"sub/a.txt", "sub/.a.txt.upload-12345678"} {
		if err := os.WriteFile(filepath.Join(dir, p), []byte(p), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(f.pending, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, rec := range map[string]string{
		"staged":    "sub/.a.txt.upload-12345678",
		"published": "sub/.b.txt.upload-87654321",
		"escape":    "../" + filepath.Base(secret), // a record never reaches out of the volume
	} {
		if err := os.WriteFile(filepath.Join(f.pending, name), []byte(rec), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	n, err := removeStaged(f.root, f.pending)
	if n != 1 {
		t.Errorf("removed %d staged files, want 1 (%v)", n, err)
	}
	if got := names(t, filepath.Join(dir, "sub")); !slices.Equal(got, []string{"a.txt"}) {
		t.Errorf("the directory holds %v, want a.txt only", got)
	}
	if _, err := os.Stat(secret); err != nil {
		t.Errorf("a record reached out of the volume: %v", err)
	}
	if got := names(t, f.pending); !slices.Equal(got, []string{"escape"}) {
		t.Errorf("records left: %v, want only the one that could not be honoured", got)
	}
}
