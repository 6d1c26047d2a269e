package envd

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
)

// TestWriteInPlace checks E2B's write semantics: the target is opened and
// truncated, never replaced by a renamed temporary file.
func TestWriteInPlace(t *testing.T) {
	e := newTestEnv(t, "")
	post := func(t *testing.T, path, body string) (int, string) {
		t.Helper()
		resp := e.do("POST", "/files?path="+path, strings.NewReader(body), map[string]string{"Content-Type": "application/octet-stream"})
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	tests := []struct {
		name  string
		setup func(t *testing.T) (path string)
		check func(t *testing.T, path string)
		code  int
	}{
		{
			name: "a hard-linked file keeps its link",
			setup: func(t *testing.T) string {
				p := filepath.Join(e.home, "linked")
				writeFile(t, p, "old")
				if err := os.Link(p, p+".2"); err != nil {
					t.Fatal(err)
				}
				chown(t, p)
				return p
			},
			check: func(t *testing.T, p string) {
				if got := readBack(t, p+".2"); got != "new" {
					t.Errorf("the other link reads %q, want new", got)
				}
			},
			code: http.StatusOK,
		},
		{
			name: "a symlink's target is written",
			setup: func(t *testing.T) string {
				target := filepath.Join(e.home, "target")
				writeFile(t, target, "old")
				chown(t, target)
				link := filepath.Join(e.home, "link")
				if err := os.Symlink(target, link); err != nil {
					t.Fatal(err)
				}
				return link
			},
			check: func(t *testing.T, p string) {
				if fi, err := os.Lstat(p); err != nil || fi.Mode()&os.ModeSymlink == 0 {
					t.Errorf("the link was replaced: %v %v", fi, err)
				}
				if got := readBack(t, filepath.Join(e.home, "target")); got != "new" {
					t.Errorf("target reads %q, want new", got)
				}
			},
			code: http.StatusOK,
		},
		{
			name: "an existing file keeps its mode",
			setup: func(t *testing.T) string {
				p := filepath.Join(e.home, "script.sh")
				writeFile(t, p, "old")
				chown(t, p)
				if err := os.Chmod(p, 0o750); err != nil {
					t.Fatal(err)
				}
				return p
			},
			check: func(t *testing.T, p string) {
				if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o750 {
					t.Errorf("mode %v %v, want 0750", fi.Mode(), err)
				}
			},
			code: http.StatusOK,
		},
		{
			name: "missing parents below a root-owned dir are made the user's",
			setup: func(t *testing.T) string {
				return filepath.Join(e.root, "opt", "app", "data", "f")
			},
			check: func(t *testing.T, p string) {
				for _, d := range []string{filepath.Join(e.root, "opt"), filepath.Join(e.root, "opt", "app", "data")} {
					fi, err := os.Stat(d)
					if err != nil || fi.Sys().(*syscall.Stat_t).Uid != testUID {
						t.Errorf("%s: %v %v, want owned by the user", d, fi, err)
					}
				}
			},
			code: http.StatusOK,
		},
		{
			name: "a FIFO is refused without blocking",
			setup: func(t *testing.T) string {
				p := filepath.Join(e.home, "fifo")
				if err := syscall.Mkfifo(p, 0o666); err != nil {
					t.Fatal(err)
				}
				chown(t, p)
				return p
			},
			code: http.StatusBadRequest,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.setup(t)
			code, body := post(t, p, "new")
			if code != tc.code {
				t.Fatalf("POST %s: %d %s, want %d", p, code, body, tc.code)
			}
			if tc.check != nil {
				tc.check(t, p)
			}
		})
	}

	t.Run("a watcher sees only the file's own name", func(t *testing.T) {
		dir := filepath.Join(e.home, "watched")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		chown(t, dir)
		w, err := fsnotify.NewWatcher()
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		if err := w.Add(dir); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, "out.txt")
		for _, body := range []string{"first", "second"} {
			if code, b := post(t, p, body); code != http.StatusOK {
				t.Fatalf("POST: %d %s", code, b)
			}
		}
		var created, written bool
		timeout := time.After(2 * time.Second)
		for !(created && written) {
			select {
			case ev := <-w.Events:
				if ev.Name != p {
					t.Fatalf("event on %s (%s), want only %s", ev.Name, ev.Op, p)
				}
				created = created || ev.Has(fsnotify.Create)
				written = written || ev.Has(fsnotify.Write)
			case <-timeout:
				t.Fatalf("events: create %v, write %v; want both", created, written)
			}
		}
	})
}

func chown(t *testing.T, p string) {
	t.Helper()
	if err := os.Lchown(p, testUID, testUID); err != nil {
		t.Fatal(err)
	}
}
