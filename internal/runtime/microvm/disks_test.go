package microvm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/confine"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/hostkey"
	"github.com/agentbox/agentbox/internal/testutil"
)

// The test binary is its own HookBinary: `<test> __hook confine <spec>`.
func TestMain(m *testing.M) {
	if len(os.Args) == 4 && os.Args[1] == "__hook" && os.Args[2] == confine.Hook {
		if err := confine.RunHook(os.Args[3]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(126)
		}
	}
	os.Exit(m.Run())
}

// TestRootImageFromHostileTree: mkfs.ext4, confined, copies a template's
// tree into the root image as it is: files of every owner and mode, a
// symlink to a host path stays a symlink (the host file is not read).
func TestRootImageFromHostileTree(t *testing.T) {
	testutil.RequireRoot(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	keys, err := hostkey.Load(filepath.Join(state, ".hostkey"))
	if err != nil {
		t.Fatal(err)
	}
	d := &Driver{cfg: Config{StateDir: state, CacheDir: t.TempDir(), HookBinary: self}, keys: keys, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	const id = "mkfstest"
	if err := os.MkdirAll(d.dir(id), 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.releaseUID(id) })

	tree := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Mkdir(filepath.Join(tree, "etc"), 0o700))
	must(os.WriteFile(filepath.Join(tree, "etc", "shadow"), []byte("root-only-content"), 0o600))
	must(os.Symlink("/etc/hostname", filepath.Join(tree, "hostname")))
	must(os.Chown(filepath.Join(tree, "etc", "shadow"), 12345, 12345))

	over := t.TempDir()
	must(os.WriteFile(filepath.Join(over, "added"), []byte("upper-layer"), 0o600))
	// Two layers: mkfs reads their overlay merge.
	img, err := d.rootImage(context.Background(), id, []string{tree, over})
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(img)
	must(err)
	if st := fi.Sys(); st == nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("image mode %v", fi.Mode())
	}
	debugfs := func(cmd string) string {
		out, err := exec.Command("debugfs", "-R", cmd, img).CombinedOutput()
		if err != nil {
			t.Fatalf("debugfs %s: %v: %s", cmd, err, out)
		}
		return string(out)
	}
	if out := debugfs("cat /etc/shadow"); !strings.Contains(out, "root-only-content") {
		t.Fatalf("the root-only file was not copied: %s", out)
	}
	if out := debugfs("cat /added"); !strings.Contains(out, "upper-layer") {
		t.Fatalf("the upper layer's file was not copied: %s", out)
	}
	if out := debugfs("stat /etc/shadow"); !strings.Contains(out, "User: 12345") {
		t.Fatalf("owner not kept: %s", out)
	}
	if out := debugfs("stat /hostname"); !strings.Contains(out, "Type: symlink") || !strings.Contains(out, "/etc/hostname") {
		t.Fatalf("the symlink was not kept as one: %s", out)
	}
}

func TestTreeSizeLimit(t *testing.T) {
	tree := t.TempDir()
	if err := os.WriteFile(filepath.Join(tree, "big"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(tree, "big"), 3<<30); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		limit int64
		ok    bool
	}{{4 << 30, true}, {2 << 30, false}} {
		_, err := treeSize(tree, tc.limit)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, errdefs.ErrTooLarge)) {
			t.Errorf("limit %d: %v", tc.limit, err)
		}
	}
}
