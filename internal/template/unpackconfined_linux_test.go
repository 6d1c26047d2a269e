package template

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/testutil"
	"github.com/agentbox/agentbox/internal/untar"
)

// The test binary is the store's Self: it runs `__hook unpack`.
func TestMain(m *testing.M) {
	if len(os.Args) >= 4 && os.Args[1] == "__hook" && os.Args[2] == UnpackHook {
		if err := RunUnpackHook(os.Args[3:]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(126)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestConfinedUnpackMatches: the confined unpacker makes what the
// in-process one makes (owners, modes, links, whiteouts, opaque markers)
// and refuses the same way, with the same errors.
func TestConfinedUnpackMatches(t *testing.T) {
	testutil.RequireRoot(t)
	layer := layerTar(t, []tarEntry{
		{name: "etc/", typ: tar.TypeDir, mode: 0o700, uid: 4242},
		{name: "etc/conf", body: "conf", mode: 0o640, uid: 4242},
		{name: "etc/hard", typ: tar.TypeLink, link: "etc/conf"},
		{name: "hard-elsewhere", typ: tar.TypeLink, link: "etc/conf"}, // across directories
		{name: "etc/sym", typ: tar.TypeSymlink, link: "/etc/conf", uid: 7},
		{name: "ro/", typ: tar.TypeDir, mode: 0o555, uid: 100},
		{name: "ro/in", body: "in a read-only dir owned by another id", uid: 100},
		{name: "gone/.wh.file", body: ""},
		{name: "opq/.wh..wh..opq", body: ""},
		{name: "opq/kept", body: "k"},
	})
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	wantDir := t.TempDir()
	wst, err := unpackArchive(context.Background(), bytes.NewReader(layer), wantDir, untar.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	gotDir := t.TempDir()
	gst, err := confinedUnpack(context.Background(), self, bytes.NewReader(gzipped(t, layer)), gotDir, untar.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if gst.Entries != wst.Entries || gst.Whiteouts != wst.Whiteouts || gst.Bytes != wst.Bytes || gst.Digest != wst.Digest || len(gst.Rejected) != 0 {
		t.Errorf("confined stats %+v, in-process %+v", gst, wst)
	}
	if got, want := treeOf(t, gotDir), treeOf(t, wantDir); got != want {
		t.Errorf("confined tree:\n%s\nin-process tree:\n%s", got, want)
	}

	// Refusals keep their type and message.
	for _, lim := range []untar.Limits{{MaxEntries: 3}, {MaxBytes: 5}, {MaxPathDepth: 1}} {
		_, werr := unpackArchive(context.Background(), bytes.NewReader(layer), t.TempDir(), lim)
		_, gerr := confinedUnpack(context.Background(), self, bytes.NewReader(layer), t.TempDir(), lim)
		if !errors.Is(gerr, errdefs.ErrTooLarge) || werr == nil || gerr.Error() != werr.Error() {
			t.Errorf("limits %+v: confined %v, in-process %v", lim, gerr, werr)
		}
	}
	if _, err := confinedUnpack(context.Background(), self, strings.NewReader("\x1f\x8bnot gzip"), t.TempDir(), untar.Limits{}); err == nil || errors.Is(err, errdefs.ErrTooLarge) {
		t.Errorf("a broken archive: %v", err)
	}
}

// treeOf lists dir: path, type, mode, owner, size, link target, xattrs.
func treeOf(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		link, _ := os.Readlink(p)
		opq := make([]byte, 8)
		n, _ := unix.Lgetxattr(p, "trusted.overlay.opaque", opq)
		fmt.Fprintf(&b, "%s %o %d:%d %d rdev=%d nlink=%d link=%q opaque=%q\n", rel, st.Mode, st.Uid, st.Gid, st.Size, st.Rdev, st.Nlink, link, opq[:max(n, 0)])
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}
