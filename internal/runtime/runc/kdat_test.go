package runc

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/testutil"
)

// kdatBytes is a cache as CRIU writes it: its magic, then anything.
func kdatBytes() []byte {
	b := make([]byte, 64)
	binary.NativeEndian.PutUint32(b, criuKdatMagic)
	b[4] = 7
	return b
}

func onTmpfs(t *testing.T, dir string) bool {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return st.Type == unix.TMPFS_MAGIC
}

func TestKdatCacheEnsure(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	cases := []struct {
		name      string
		tmpfs     bool // the cache dir is a tmpfs: CRIU caches by itself
		probe     []byte
		probeErr  error
		wantFile  bool
		wantCalls int // probes over: ensure, ensure, remove the file, ensure
	}{
		{name: "not a tmpfs: placed once, again when CRIU removed it", probe: kdatBytes(), wantFile: true, wantCalls: 2},
		{name: "tmpfs: left to CRIU", tmpfs: true, probe: kdatBytes(), wantCalls: 0},
		{name: "CRIU wrote no cache: nothing placed, not tried again", probe: []byte("not a cache"), wantCalls: 1},
		{name: "probe failed: nothing placed, not tried again", probeErr: errors.New("unshare: operation not permitted"), wantCalls: 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var dir string
			if tc.tmpfs {
				d, err := os.MkdirTemp("/dev/shm", "kdat-test-")
				if err != nil || !onTmpfs(t, d) {
					t.Skip("no tmpfs at /dev/shm")
				}
				t.Cleanup(func() { os.RemoveAll(d) })
				dir = d
			} else {
				// The test's own dir, beside the source: not a tmpfs
				// where the source tree is not.
				d, err := os.MkdirTemp(".", ".kdat-test-")
				if err == nil {
					d, err = filepath.Abs(d)
				}
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { os.RemoveAll(d) })
				if onTmpfs(t, d) {
					t.Skip("the source tree is on a tmpfs")
				}
				dir = d
			}
			file := filepath.Join(dir, "criu.kdat")
			calls := 0
			k := &kdatCache{file: file, probe: func(_ context.Context, criu, runDir string) ([]byte, error) {
				calls++
				if criu != "/x/criu" || runDir != dir {
					t.Errorf("probe(%q, %q); want /x/criu, %s", criu, runDir, dir)
				}
				return tc.probe, tc.probeErr
			}}
			ctx := context.Background()
			k.ensure(ctx, "/x/criu", quiet)
			b, err := os.ReadFile(file)
			if tc.wantFile != (err == nil) {
				t.Fatalf("cache file after ensure: %v; want it there = %v", err, tc.wantFile)
			}
			if tc.wantFile {
				if !bytes.Equal(b, tc.probe) {
					t.Fatalf("cache file holds %q, want what CRIU wrote", b)
				}
				if st, err := os.Stat(file); err != nil || st.Mode().Perm() != 0o600 {
					t.Fatalf("cache file mode %v, %v; want 0600", st.Mode(), err)
				}
			}
			k.ensure(ctx, "/x/criu", quiet)
			_ = os.Remove(file) // as CRIU does with a cache of another build
			k.ensure(ctx, "/x/criu", quiet)
			if calls != tc.wantCalls {
				t.Fatalf("probed %d times, want %d", calls, tc.wantCalls)
			}
			ents, _ := os.ReadDir(dir)
			for _, e := range ents {
				if strings.HasPrefix(e.Name(), ".agentbox-criu.kdat-") {
					t.Fatalf("temporary file %s left behind", e.Name())
				}
			}
		})
	}
}

// TestProbeKdat runs the real CRIU in a private mount namespace and checks
// that it hands back its cache and leaves the host's /run as it was: no
// tmpfs on it, and CRIU's cache there not touched.
func TestProbeKdat(t *testing.T) {
	testutil.RequireRoot(t)
	criu, err := (&Driver{log: slog.New(slog.NewTextHandler(io.Discard, nil)), kdat: kdatCache{done: true}}).criu()
	if err != nil {
		t.Skip(err)
	}
	runDir := filepath.Dir(criuKdatFile)
	mountedOnRun := func() []string {
		b, err := os.ReadFile("/proc/self/mountinfo")
		if err != nil {
			t.Fatal(err)
		}
		var on []string
		for l := range strings.Lines(string(b)) {
			if f := strings.Fields(l); len(f) > 4 && f[4] == runDir {
				on = append(on, l)
			}
		}
		return on
	}
	before := mountedOnRun()
	nsBefore, _ := os.Readlink("/proc/self/ns/mnt")
	// Several probes: any that ran on the process's main thread would
	// leave it (and so /proc/self, the server's view) in the private
	// namespace.
	for range 8 {
		b, err := probeKdat(context.Background(), criu, runDir)
		if err != nil {
			t.Fatal(err)
		}
		if err := checkKdat(b); err != nil {
			t.Fatal(err)
		}
		if ns, _ := os.Readlink("/proc/self/ns/mnt"); ns != nsBefore {
			t.Fatalf("the probe moved the process's main thread to mount namespace %s (was %s)", ns, nsBefore)
		}
	}
	if after := mountedOnRun(); len(after) != len(before) {
		t.Fatalf("the probe left a mount on %s in the host's namespace: %q (before: %q)", runDir, after, before)
	}
}
