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

	"github.com/agentbox/agentbox/internal/confine"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/testutil"
)

// The test binary is the store's Self: it runs `__hook unpack`, or, with
// confine.ProbeEnv set, a sealed child that tries to leave.
func TestMain(m *testing.M) {
	if len(os.Args) >= 4 && os.Args[1] == "__hook" && os.Args[2] == UnpackHook {
		work := sealedUnpack
		if p := os.Getenv(confine.ProbeEnv); p != "" {
			work = func(UnpackLimits) unpackResult { return probeEscape(p) }
		}
		if err := runUnpackHook(os.Args[3:], work); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(126)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// probeEscape is hostile code in the sealed child (a parser bug turned
// into code execution): each attempt is reported in Rejected as
// "what: <error>" or "what: ok".
func probeEscape(outside string) unpackResult {
	var res unpackResult
	try := func(what string, err error) {
		msg := "ok"
		if err != nil {
			msg = err.Error()
		}
		res.Stats.Rejected = append(res.Stats.Rejected, what+": "+msg)
	}
	try("write outside", func() error {
		if err := os.MkdirAll(outside, 0o755); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(outside, "pwned"), []byte("x"), 0o644)
	}())
	try("socket inet", socket(unix.AF_INET, unix.SOCK_STREAM))
	try("socket unix", socket(unix.AF_UNIX, unix.SOCK_STREAM))
	try("socket netlink", socket(unix.AF_NETLINK, unix.SOCK_RAW))
	try("chroot", func() error {
		if err := os.Mkdir("/jail", 0o755); err != nil {
			return err
		}
		return unix.Chroot("/jail")
	}())
	try("exec", unix.Exec("/bin/sh", []string{"sh", "-c", "true"}, nil))
	try("host proc", func() error { _, err := os.Stat("/proc/1/root"); return err }())
	try("mknod block", unix.Mknod("/sda", unix.S_IFBLK|0o600, int(unix.Mkdev(8, 0))))
	try("trusted xattr", unix.Setxattr("/", "trusted.overlay.opaque", []byte("y"), 0))
	try("mount", unix.Mount("none", "/", "tmpfs", 0, ""))
	try("ptrace", func() error { _, _, e := unix.Syscall(unix.SYS_PTRACE, unix.PTRACE_ATTACH, 1, 0); return errnoErr(e) }())
	return res
}

func socket(domain, typ int) error {
	fd, err := unix.Socket(domain, typ, 0)
	if err == nil {
		unix.Close(fd)
	}
	return err
}

func errnoErr(e unix.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

func selfBinary(t *testing.T) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return self
}

// TestConfinedUnpackCannotLeave: code running in the unpacker's child
// writes nothing outside its destination, opens no socket, execs nothing,
// and keeps no capability beyond owners and modes.
func TestConfinedUnpackCannotLeave(t *testing.T) {
	testutil.RequireRoot(t)
	outside := filepath.Join(t.TempDir(), "outside")
	t.Setenv(confine.ProbeEnv, outside)
	dst := t.TempDir()
	st, err := confinedUnpack(context.Background(), selfBinary(t), strings.NewReader(""), dst, UnpackLimits{})
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Rejected) != 11 {
		t.Fatalf("probe reported %q", st.Rejected)
	}
	for _, r := range st.Rejected {
		what, msg, _ := strings.Cut(r, ": ")
		if what == "write outside" {
			// It lands inside the destination, where the child's root is.
			if _, err := os.Stat(filepath.Join(dst, outside, "pwned")); err != nil {
				t.Errorf("the probe's write did not land inside the destination: %v (%s)", err, msg)
			}
			continue
		}
		if msg == "ok" {
			t.Errorf("%s: allowed in the confined unpacker", what)
		}
	}
	if _, err := os.Stat(filepath.Join(outside, "pwned")); err == nil {
		t.Error("the confined unpacker wrote outside its destination")
	}
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
	self := selfBinary(t)
	wantDir := t.TempDir()
	wst, err := unpackArchive(context.Background(), bytes.NewReader(layer), wantDir, UnpackLimits{})
	if err != nil {
		t.Fatal(err)
	}
	gotDir := t.TempDir()
	gst, err := confinedUnpack(context.Background(), self, bytes.NewReader(gzipped(t, layer)), gotDir, UnpackLimits{})
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
	for _, lim := range []UnpackLimits{{MaxFiles: 3}, {MaxBytes: 5}, {MaxPathDepth: 1}} {
		_, werr := unpackArchive(context.Background(), bytes.NewReader(layer), t.TempDir(), lim)
		_, gerr := confinedUnpack(context.Background(), self, bytes.NewReader(layer), t.TempDir(), lim)
		if !errors.Is(gerr, errdefs.ErrTooLarge) || werr == nil || gerr.Error() != werr.Error() {
			t.Errorf("limits %+v: confined %v, in-process %v", lim, gerr, werr)
		}
	}
	if _, err := confinedUnpack(context.Background(), self, strings.NewReader("\x1f\x8bnot gzip"), t.TempDir(), UnpackLimits{}); err == nil || errors.Is(err, errdefs.ErrTooLarge) {
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
