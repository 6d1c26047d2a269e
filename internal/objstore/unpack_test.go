package objstore

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/untar"
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("AGENTBOX_REQUIRE_ROOT") == "1" {
		t.Fatal("needs root (AGENTBOX_REQUIRE_ROOT=1)")
	}
	t.Skip("needs root")
}

// entry is one crafted tar entry.
type entry struct {
	name, body, link string
	typ              byte
	size             int64 // declared size when set (no body written)
	major, minor     int64
	pax              map[string]string
}

func craft(t *testing.T, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: 0o644, Size: int64(len(e.body)),
			Devmajor: e.major, Devminor: e.minor, PAXRecords: e.pax, Format: tar.FormatPAX}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Typeflag == tar.TypeDir {
			h.Mode = 0o755
		}
		if h.Typeflag != tar.TypeReg {
			h.Size = 0
		}
		if e.size > 0 {
			h.Size = e.size
			if err := tw.WriteHeader(h); err != nil {
				t.Fatal(err)
			}
			return buf.Bytes() // the content never comes
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// oldSparseTar is dir in GNU tar's own format, whose sparse files are
// entries of type 'S'.
func oldSparseTar(t *testing.T, dir string) []byte {
	t.Helper()
	out, err := exec.Command("tar", "-C", dir, "-c", "--format=gnu", "--sparse", "--numeric-owner", ".").Output()
	if err != nil {
		t.Fatalf("tar -c: %v", err)
	}
	return out
}

// gnuTar is what the server's own tar writes of dir (PutImage's flags).
func gnuTar(t *testing.T, dir string) []byte {
	t.Helper()
	out, err := exec.Command("tar", append(append([]string{"-C", dir, "-c"}, tarFlags...), ".")...).Output()
	if err != nil {
		t.Fatalf("tar -c: %v", err)
	}
	return out
}

func TestUnpackRefuses(t *testing.T) {
	requireRoot(t)
	outside := t.TempDir()
	victim := filepath.Join(outside, "victim")
	if err := os.WriteFile(victim, []byte("intact"), 0o644); err != nil {
		t.Fatal(err)
	}
	up := strings.Repeat("../", 16) + strings.TrimPrefix(outside, "/")
	sparseSrc := t.TempDir()
	if err := os.WriteFile(filepath.Join(sparseSrc, "hole"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(sparseSrc, "hole"), 2<<30); err != nil {
		t.Fatal(err)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(craft(t, entry{name: "zeros", body: strings.Repeat("\x00", 8<<20)}))
	zw.Close()
	small := untar.Limits{MaxEntryBytes: 1 << 30, MaxBytes: 3 << 20, MaxEntries: 50}

	for _, tc := range []struct {
		name   string
		tar    []byte
		lim    untar.Limits
		unsafe bool // wants ErrUnsafeImage (else any error)
	}{
		{"dot-dot name", craft(t, entry{name: up + "/escape", body: "x"}), small, true},
		{"absolute name", craft(t, entry{name: outside + "/escape", body: "x"}), small, true},
		{"symlink then a file through it", craft(t,
			entry{name: "link", link: outside, typ: tar.TypeSymlink},
			entry{name: "link/victim", body: "overwritten"}), small, true},
		{"relative symlink then a file through it", craft(t,
			entry{name: "d", typ: tar.TypeDir},
			entry{name: "d/rel", link: up, typ: tar.TypeSymlink},
			entry{name: "d/rel/victim", body: "overwritten"}), small, true},
		{"symlink inside, then a file through it", craft(t,
			entry{name: "d", typ: tar.TypeDir},
			entry{name: "in", link: "d", typ: tar.TypeSymlink},
			entry{name: "in/x", body: "x"}), small, true},
		{"hard link to a host file", craft(t, entry{name: "hard", link: victim, typ: tar.TypeLink}), small, true},
		{"hard link out by ..", craft(t, entry{name: "hard", link: up + "/victim", typ: tar.TypeLink}), small, true},
		{"hard link to a symlink", craft(t,
			entry{name: "s", link: victim, typ: tar.TypeSymlink},
			entry{name: "hard", link: "s", typ: tar.TypeLink}), small, true},
		{"device node", craft(t, entry{name: "mem", typ: tar.TypeChar, major: 1, minor: 1}), small, true},
		{"block device", craft(t, entry{name: "sda", typ: tar.TypeBlock, major: 8}), small, true},
		{"replace an entry", craft(t, entry{name: "a", body: "1"}, entry{name: "a", link: victim, typ: tar.TypeSymlink}), small, true},
		{"file under a file", craft(t, entry{name: "a", body: "1"}, entry{name: "a/b", body: "2"}), small, true},
		{"oversized xattrs", craft(t, entry{name: "a", body: "1", pax: map[string]string{xattrPrefix + "user.a": strings.Repeat("a", 70<<10)}}), small, true},
		{"huge declared file", craft(t, entry{name: "big", size: 1 << 40}), small, true},
		{"huge sparse file", gnuTar(t, sparseSrc), small, true},
		{"huge sparse file, GNU's old format", oldSparseTar(t, sparseSrc), small, true},
		{"past the total", craft(t, entry{name: "a", body: strings.Repeat("a", 2<<20)}, entry{name: "b", body: strings.Repeat("b", 2<<20)}), small, true},
		{"too many entries", craft(t, func() []entry {
			var es []entry
			for i := range 60 {
				es = append(es, entry{name: "f" + strings.Repeat("x", i), body: "x"})
			}
			return es
		}()...), small, true},
		{"decompression bomb", gz.Bytes(), untar.Limits{}, true},
	} {
		for how, unpack := range unpackers(t) {
			t.Run(how+"/"+tc.name, func(t *testing.T) {
				dir := filepath.Join(t.TempDir(), "img")
				if err := os.Mkdir(dir, 0o700); err != nil {
					t.Fatal(err)
				}
				err := unpack(tc.tar, dir, tc.lim)
				if err == nil || (tc.unsafe && !errors.Is(err, ErrUnsafeImage)) {
					t.Fatalf("Unpack = %v, want a refusal", err)
				}
				if b, _ := os.ReadFile(victim); string(b) != "intact" {
					t.Fatalf("the host file was overwritten: %q", b)
				}
				if es, _ := os.ReadDir(outside); len(es) != 1 {
					t.Fatalf("something was made outside: %v", es)
				}
				t.Logf("refused: %v", err)
			})
		}
	}
}

// TestUnpackRoundTrip: what the server's tar writes of a snapshot comes
// back the same: owners, modes, set-id bits, links, whiteouts, FIFOs,
// kept xattrs, holes.
func TestUnpackRoundTrip(t *testing.T) {
	requireRoot(t)
	src := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	p := func(n string) string { return filepath.Join(src, n) }
	must(os.MkdirAll(p("upper/etc/sub"), 0o755))
	must(os.WriteFile(p("upper/etc/shadow"), []byte("secret"), 0o640))
	must(os.Chown(p("upper/etc/shadow"), 100000, 100042))
	must(os.WriteFile(p("upper/su"), []byte("#!"), 0o755))
	must(os.Chown(p("upper/su"), 100000, 100000))
	must(os.Chmod(p("upper/su"), 0o4755))
	must(os.Link(p("upper/etc/shadow"), p("upper/shadow.hard")))
	must(os.Symlink("/etc/passwd", p("upper/abs")))
	must(os.Lchown(p("upper/abs"), 100007, 100007))
	must(unix.Mknod(p("upper/gone"), unix.S_IFCHR, 0))
	must(unix.Mkfifo(p("upper/fifo"), 0o620))
	must(unix.Setxattr(p("upper/etc/sub"), "trusted.overlay.opaque", []byte("y"), 0))
	must(unix.Setxattr(p("upper/etc/shadow"), "user.note", []byte("kept"), 0))
	must(os.Chmod(p("upper/etc/sub"), 0o1777))
	f, err := os.Create(p("image.raw"))
	must(err)
	must(f.Truncate(64 << 20))
	_, err = f.WriteAt([]byte("data"), 32<<20)
	must(err)
	f.Close()

	for how, unpack := range unpackers(t) {
		t.Run(how, func(t *testing.T) { checkRoundTrip(t, src, unpack) })
	}
}

func checkRoundTrip(t *testing.T, src string, unpack func([]byte, string, untar.Limits) error) {
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	p := func(n string) string { return filepath.Join(src, n) }
	// GNU's old sparse entries ('S') unpack as files too.
	old := t.TempDir()
	must(unpack(oldSparseTar(t, src), old, untar.Limits{}))
	if b, err := os.ReadFile(filepath.Join(old, "image.raw")); err != nil || len(b) != 64<<20 || string(b[32<<20:32<<20+4]) != "data" {
		t.Fatalf("image.raw from the GNU format differs: %v", err)
	}

	dst := t.TempDir()
	must(unpack(gnuTar(t, src), dst, untar.Limits{}))

	for _, n := range []string{"upper", "upper/etc", "upper/etc/sub", "upper/etc/shadow", "upper/su", "upper/abs", "upper/gone", "upper/fifo", "image.raw"} {
		a, err := os.Lstat(p(n))
		must(err)
		b, err := os.Lstat(filepath.Join(dst, n))
		if err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		sa, sb := a.Sys().(*syscall.Stat_t), b.Sys().(*syscall.Stat_t)
		if sa.Mode != sb.Mode || sa.Uid != sb.Uid || sa.Gid != sb.Gid || sa.Rdev != sb.Rdev || a.Size() != b.Size() {
			t.Errorf("%s: mode %o uid %d gid %d rdev %d size %d, want %o %d %d %d %d", n, sb.Mode, sb.Uid, sb.Gid, sb.Rdev, b.Size(), sa.Mode, sa.Uid, sa.Gid, sa.Rdev, a.Size())
		}
		if !a.IsDir() && !a.ModTime().Equal(b.ModTime()) && a.Mode()&os.ModeSymlink == 0 {
			t.Errorf("%s: mtime %v, want %v", n, b.ModTime(), a.ModTime())
		}
	}
	if l, _ := os.Readlink(filepath.Join(dst, "upper/abs")); l != "/etc/passwd" {
		t.Errorf("symlink target %q", l)
	}
	s1, _ := os.Stat(filepath.Join(dst, "upper/etc/shadow"))
	s2, _ := os.Stat(filepath.Join(dst, "upper/shadow.hard"))
	if !os.SameFile(s1, s2) {
		t.Error("the hard link is a copy")
	}
	buf := make([]byte, 8)
	if n, _ := unix.Getxattr(filepath.Join(dst, "upper/etc/sub"), "trusted.overlay.opaque", buf); string(buf[:n]) != "y" {
		t.Error("the opaque marker was lost")
	}
	if n, _ := unix.Getxattr(filepath.Join(dst, "upper/etc/shadow"), "user.note", buf); string(buf[:n]) != "kept" {
		t.Error("the user xattr was lost")
	}
	img, err := os.Stat(filepath.Join(dst, "image.raw"))
	must(err)
	if blocks := img.Sys().(*syscall.Stat_t).Blocks * 512; blocks > 1<<20 {
		t.Errorf("image.raw takes %d bytes on disk: its holes were written", blocks)
	}
	b, _ := os.ReadFile(filepath.Join(dst, "image.raw"))
	if len(b) != 64<<20 || string(b[32<<20:32<<20+4]) != "data" {
		t.Error("image.raw's content differs")
	}
}

// TestUnpackXattrs: only the attributes a sandbox may own come back.
func TestUnpackXattrs(t *testing.T) {
	requireRoot(t)
	v3 := func(rootid byte) string {
		return "\x01\x00\x00\x03" + "\x00\x20\x00\x00" + strings.Repeat("\x00", 12) + string([]byte{rootid, 0x86, 1, 0})
	}
	for _, tc := range []struct {
		name, xattr, value string
		kept               bool
	}{
		{"user attribute", "user.note", "x", true},
		{"opaque marker", "trusted.overlay.opaque", "y", true},
		{"overlay redirect", "trusted.overlay.redirect", "/etc", false},
		{"selinux label", "security.selinux", "system_u:object_r:shadow_t:s0", false},
		{"v2 file capability", "security.capability", "\x01\x00\x00\x02" + strings.Repeat("\xff", 16), false},
		{"v3 capability of host root", "security.capability", "\x01\x00\x00\x03" + strings.Repeat("\x00", 20), false},
		{"v3 capability of a sandbox root", "security.capability", v3(0xa0), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			tr := craft(t, entry{name: "f", body: "1", pax: map[string]string{xattrPrefix + tc.xattr: tc.value}})
			if err := Unpack(context.Background(), bytes.NewReader(tr), dir, untar.Limits{}); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 256)
			n, err := unix.Getxattr(filepath.Join(dir, "f"), tc.xattr, buf)
			if kept := err == nil && string(buf[:n]) == tc.value; kept != tc.kept {
				t.Fatalf("kept = %v (%v), want %v", kept, err, tc.kept)
			}
		})
	}
}
