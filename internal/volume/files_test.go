package volume

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// files opens a plain directory as a volume's tree (the tree's rules do
// not depend on the volume's own filesystem), with a secret file beside it
// that nothing may reach.
func files(t *testing.T) (*Files, string, string) {
	t.Helper()
	base := t.TempDir()
	dir := filepath.Join(base, "vol")
	if err := os.Mkdir(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(base, "secret")
	if err := os.WriteFile(secret, []byte("host secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	f := &Files{root: root, sizeMB: 1, pending: filepath.Join(base, "pending")}
	t.Cleanup(func() { f.Close() })
	return f, dir, secret
}

func u32(v uint32) *uint32 { return &v }

func wantErr(t *testing.T, err, want error, what string) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: %v, want %v", what, err, want)
	}
}

func TestFilesWriteRead(t *testing.T) {
	f, dir, _ := files(t)
	e, err := f.Write("/a.txt", strings.NewReader("hello"), Meta{}, false)
	if err != nil {
		t.Fatal(err)
	}
	if e.Name != "a.txt" || e.Path != "/a.txt" || e.Type != TypeFile || e.Size != 5 || e.Mode != 0o644 || e.UID != 0 || e.GID != 0 {
		t.Fatalf("entry %+v", e)
	}
	if e.Mtime.IsZero() || e.Atime.IsZero() || e.Ctime.IsZero() {
		t.Fatalf("times missing: %+v", e)
	}
	// A relative path is the same path.
	fd, e2, err := f.Open("a.txt")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(fd)
	fd.Close()
	if string(b) != "hello" || e2.Size != 5 {
		t.Fatalf("read %q %+v", b, e2)
	}
	_, err = f.Write("/a.txt", strings.NewReader("again"), Meta{}, false)
	wantErr(t, err, errdefs.ErrConflict, "overwrite without force")
	e, err = f.Write("/a.txt", strings.NewReader("new"), Meta{UID: u32(1000), GID: u32(1001), Mode: u32(0o600)}, true)
	if err != nil || e.Size != 3 || e.UID != 1000 || e.GID != 1001 || e.Mode != 0o600 {
		t.Fatalf("forced overwrite: %+v %v", e, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "a.txt")); string(b) != "new" {
		t.Fatalf("file holds %q", b)
	}
	// No upload temporary is left beside it.
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Fatalf("dir holds %v", ents)
	}
	_, err = f.Write("/missing/b.txt", strings.NewReader("x"), Meta{}, false)
	wantErr(t, err, errdefs.ErrNotFound, "write into a missing directory")
	_, err = f.Write("/a.txt/b", strings.NewReader("x"), Meta{}, false)
	wantErr(t, err, errdefs.ErrInvalidArgument, "write under a file")
	_, err = f.Write("/", strings.NewReader("x"), Meta{}, true)
	wantErr(t, err, errdefs.ErrInvalidArgument, "write the root")
	if err := os.Mkdir(filepath.Join(dir, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err = f.Write("/d", strings.NewReader("x"), Meta{}, true)
	wantErr(t, err, errdefs.ErrConflict, "write over a directory")
	_, _, err = f.Open("/d")
	wantErr(t, err, errdefs.ErrInvalidArgument, "read a directory")
	_, _, err = f.Open("/nope")
	wantErr(t, err, errdefs.ErrNotFound, "read a missing file")
	_, err = f.Write("/big", strings.NewReader("x"), Meta{UID: u32(65536)}, false)
	wantErr(t, err, errdefs.ErrInvalidArgument, "uid past the sandbox range")
	_, err = f.Write("/big", strings.NewReader("x"), Meta{Mode: u32(0o10000)}, false)
	wantErr(t, err, errdefs.ErrInvalidArgument, "mode with type bits")
}

// errReader fails after its data: a client that went away mid-upload.
type errReader struct{ n int }

func (r *errReader) Read(p []byte) (int, error) {
	if r.n == 0 {
		return 0, io.ErrUnexpectedEOF
	}
	r.n--
	return copy(p, "xxxx"), nil
}

func TestFilesCutUploadKeepsOld(t *testing.T) {
	f, dir, _ := files(t)
	if _, err := f.Write("/a", strings.NewReader("old"), Meta{}, false); err != nil {
		t.Fatal(err)
	}
	_, err := f.Write("/a", &errReader{n: 3}, Meta{}, true)
	wantErr(t, err, errdefs.ErrInvalidArgument, "cut-off upload")
	if b, _ := os.ReadFile(filepath.Join(dir, "a")); string(b) != "old" {
		t.Fatalf("a cut-off forced upload changed the file: %q", b)
	}
	_, err = f.Write("/b", &errReader{n: 3}, Meta{}, false)
	wantErr(t, err, errdefs.ErrInvalidArgument, "cut-off upload")
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("a cut-off upload left %v", ents)
	}
}

func TestFilesDirs(t *testing.T) {
	f, _, _ := files(t)
	e, err := f.MakeDir("/x", Meta{UID: u32(1000), GID: u32(1000), Mode: u32(0o750)}, false)
	if err != nil || e.Type != TypeDirectory || e.UID != 1000 || e.Mode != 0o750 || e.Path != "/x" {
		t.Fatalf("mkdir: %+v %v", e, err)
	}
	_, err = f.MakeDir("/x", Meta{}, false)
	wantErr(t, err, errdefs.ErrConflict, "mkdir existing")
	if _, err := f.MakeDir("/x", Meta{}, true); err != nil {
		t.Fatalf("mkdir existing with force: %v", err)
	}
	_, err = f.MakeDir("/p/q/r", Meta{}, false)
	wantErr(t, err, errdefs.ErrNotFound, "mkdir without parents")
	e, err = f.MakeDir("/p/q/r", Meta{Mode: u32(0o700)}, true)
	if err != nil || e.Mode != 0o700 {
		t.Fatalf("mkdir -p: %+v %v", e, err)
	}
	if e, _ := f.Stat("/p/q"); e.Mode != 0o700 || e.Type != TypeDirectory {
		t.Fatalf("parent made with force: %+v", e)
	}
	if _, err := f.Write("/p/q/r/f", strings.NewReader("1"), Meta{}, false); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write("/file", strings.NewReader("1"), Meta{}, false); err != nil {
		t.Fatal(err)
	}
	_, err = f.MakeDir("/file/sub", Meta{}, true)
	wantErr(t, err, errdefs.ErrConflict, "mkdir under a file")

	list := func(p string, depth int) []string {
		t.Helper()
		var out []string
		if err := f.List(p, depth, func(e Entry) error { out = append(out, e.Path); return nil }); err != nil {
			t.Fatalf("list %s %d: %v", p, depth, err)
		}
		slices.Sort(out)
		return out
	}
	if got := list("/", 1); !slices.Equal(got, []string{"/file", "/p", "/x"}) {
		t.Fatalf("list / 1: %v", got)
	}
	if got := list("/p", 3); !slices.Equal(got, []string{"/p/q", "/p/q/r", "/p/q/r/f"}) {
		t.Fatalf("list /p 3: %v", got)
	}
	err = f.List("/file", 1, func(Entry) error { return nil })
	wantErr(t, err, errdefs.ErrInvalidArgument, "list a file")
	err = f.List("/none", 1, func(Entry) error { return nil })
	wantErr(t, err, errdefs.ErrNotFound, "list a missing dir")
	err = f.List("/", 0, func(Entry) error { return nil })
	wantErr(t, err, errdefs.ErrInvalidArgument, "depth 0")

	if err := f.Remove("/p"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Stat("/p/q/r/f"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("removed tree still there: %v", err)
	}
	wantErr(t, f.Remove("/p"), errdefs.ErrNotFound, "remove twice")
	wantErr(t, f.Remove("/"), errdefs.ErrInvalidArgument, "remove the root")
	wantErr(t, f.Remove("/.."), errdefs.ErrInvalidArgument, "remove /.. (the root)")

	e, err = f.SetMeta("/x", Meta{UID: u32(7), Mode: u32(0o1777)})
	if err != nil || e.UID != 7 || e.GID != 1000 || e.Mode != 0o1777 {
		t.Fatalf("setmeta: %+v %v", e, err)
	}
	_, err = f.SetMeta("/none", Meta{Mode: u32(0o644)})
	wantErr(t, err, errdefs.ErrNotFound, "setmeta missing")
	_, err = f.SetMeta("/x", Meta{GID: u32(1 << 20)})
	wantErr(t, err, errdefs.ErrInvalidArgument, "setmeta gid out of range")
}

// TestFilesEscapes: no path, symlink or combination of them reaches a file
// outside the volume, whichever operation is asked.
func TestFilesEscapes(t *testing.T) {
	f, dir, secret := files(t)
	out := filepath.Dir(secret)
	for name, target := range map[string]string{
		"abs":       secret,
		"rel":       "../secret",
		"deeprel":   "../../../../../../" + strings.TrimPrefix(secret, "/"),
		"absdir":    out,
		"reldir":    "..",
		"selfloop":  "selfloop",
		"absinside": "/a", // absolute symlinks are refused even when they would land inside
	} {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "a"), []byte("inside"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("a", filepath.Join(dir, "ok")); err != nil {
		t.Fatal(err)
	}
	reads := []string{"/abs", "/rel", "/deeprel", "/absdir/secret", "/reldir/secret", "/reldir/vol/a", "/selfloop", "/absinside",
		"/../secret", "../secret", "/a/../../secret"}
	for _, p := range reads {
		fd, _, err := f.Open(p)
		if err == nil {
			b, _ := io.ReadAll(fd)
			fd.Close()
			if strings.Contains(string(b), "host secret") {
				t.Fatalf("read %s reached the host file", p)
			}
			if p != "/../secret" && p != "../secret" && p != "/a/../../secret" {
				t.Fatalf("read %s succeeded: %q", p, b)
			}
		}
	}
	// ".." is cleaned inside the volume: /../secret is the volume's /secret.
	if _, _, err := f.Open("/../secret"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("/../secret: %v, want not found (the volume's own /secret)", err)
	}
	// A symlink inside the volume to a file inside it is followed.
	if fd, _, err := f.Open("/ok"); err != nil {
		t.Fatalf("in-volume symlink: %v", err)
	} else {
		fd.Close()
	}
	for _, p := range []string{"/absdir/new", "/reldir/new", "/abs", "/rel"} {
		_, err := f.Write(p, strings.NewReader("pwned"), Meta{}, false)
		if err == nil {
			t.Fatalf("write %s succeeded", p)
		}
	}
	// A forced write over a symlink replaces the link, never its target.
	if _, err := f.Write("/abs", strings.NewReader("pwned"), Meta{}, true); err != nil {
		t.Fatalf("forced write over a symlink: %v", err)
	}
	for _, p := range []string{"/absdir/x", "/reldir/x", "/absdir", "/reldir/vol"} {
		if _, err := f.MakeDir(p, Meta{}, true); err == nil && p != "/absdir" && p != "/reldir/vol" {
			t.Fatalf("mkdir %s succeeded", p)
		}
	}
	for _, p := range []string{"/absdir/secret", "/reldir/secret"} {
		if err := f.Remove(p); err == nil {
			t.Fatalf("remove %s succeeded", p)
		}
		if _, err := f.SetMeta(p, Meta{Mode: u32(0o777)}); err == nil {
			t.Fatalf("setmeta %s succeeded", p)
		}
		if err := f.List(p, 1, func(Entry) error { return nil }); err == nil {
			t.Fatalf("list %s succeeded", p)
		}
	}
	if err := f.List("/absdir", 1, func(Entry) error { return nil }); err == nil {
		t.Fatal("listing a symlink to a host directory succeeded")
	}
	// Removing a symlink to the outside removes the link only.
	if err := f.Remove("/rel"); err != nil {
		t.Fatal(err)
	}
	if err := f.Remove("/absdir"); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(secret)
	if err != nil || string(b) != "host secret" {
		t.Fatalf("host file after the attacks: %q %v", b, err)
	}
	if fi, err := os.Stat(secret); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("host file mode changed: %v %v", fi.Mode(), err)
	}
	if _, err := os.Stat(filepath.Join(out, "new")); err == nil {
		t.Fatal("a file was created outside the volume")
	}
	// Stat of a symlink describes the link, naming its target.
	if e, err := f.Stat("/deeprel"); err != nil || e.Type != TypeSymlink || e.Target == "" {
		t.Fatalf("stat symlink: %+v %v", e, err)
	}
	_, err = f.SetMeta("/deeprel", Meta{Mode: u32(0o777)})
	wantErr(t, err, errdefs.ErrInvalidArgument, "chmod a symlink")
	if _, err := f.SetMeta("/deeprel", Meta{UID: u32(5)}); err != nil {
		t.Fatalf("chown a symlink itself: %v", err)
	}
	for _, p := range []string{"", "a\x00b", strings.Repeat("a", 5000)} {
		if _, err := f.Stat(p); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("path %q: %v", p, err)
		}
	}
}

// TestFilesFIFO: reading a FIFO that code in a sandbox made is refused
// at once instead of hanging the server.
func TestFilesFIFO(t *testing.T) {
	f, dir, _ := files(t)
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o666); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, _, err := f.Open("/fifo")
		done <- err
	}()
	select {
	case err := <-done:
		wantErr(t, err, errdefs.ErrInvalidArgument, "read a FIFO")
	case <-time.After(5 * time.Second):
		t.Fatal("reading a FIFO hangs")
	}
	if e, err := f.Stat("/fifo"); err != nil || e.Type != TypeUnknown {
		t.Fatalf("stat FIFO: %+v %v", e, err)
	}
	if _, err := f.SetMeta("/fifo", Meta{Mode: u32(0o600)}); err != nil {
		t.Fatalf("chmod FIFO: %v", err)
	}
}
