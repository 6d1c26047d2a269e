package bundle

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/hostkey"
)

func TestUIDPool(t *testing.T) {
	tmp := t.TempDir()
	p := &uidPool{dir: filepath.Join(tmp, "ranges"), base: 100000, size: 65536, count: 3}
	holder := func(name string) string {
		d := filepath.Join(tmp, name)
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		return d
	}
	a, err := p.alloc(holder("a"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.alloc(holder("b"))
	if err != nil || b == a {
		t.Fatalf("second range %d (%v), first %d: want a different one", b, err, a)
	}
	img := holder("image-of-a")
	if err := p.hold(a, img); err != nil {
		t.Fatal(err)
	}
	c, err := p.alloc(holder("c"))
	if err != nil || c == a || c == b {
		t.Fatalf("third range %d (%v)", c, err)
	}
	if _, err := p.alloc(holder("d")); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("a fourth range from a pool of three: %v", err)
	}
	// a's bundle is gone but its memory image is not: a stays taken.
	if err := os.RemoveAll(filepath.Join(tmp, "a")); err != nil {
		t.Fatal(err)
	}
	if _, err := p.alloc(holder("d")); err == nil {
		t.Fatal("a range was reused while a memory image of it exists")
	}
	// Once every file of it is gone, it is free again; so is b's.
	if err := os.RemoveAll(img); err != nil {
		t.Fatal(err)
	}
	got, err := p.alloc(holder("d"))
	if err != nil || got != a {
		t.Fatalf("range after its last holder went: %d (%v), want %d", got, err, a)
	}
	// A memory image holds its range through a link to its marker, also
	// after the image dir is renamed (the snapshot store moves it into
	// place), until the marker is gone.
	imgDir := holder("snap.tmp")
	marker := filepath.Join(imgDir, imageRangeFile)
	if err := os.WriteFile(marker, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(tmp, "d")); err != nil { // d held a
		t.Fatal(err)
	}
	if err := p.holdLinked(a, marker); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(imgDir, filepath.Join(tmp, "snap")); err != nil {
		t.Fatal(err)
	}
	if got, err := p.alloc(holder("f")); err == nil && got == a {
		t.Fatal("a range was reused while a moved memory image of it exists")
	} else if err == nil {
		_ = os.RemoveAll(filepath.Join(tmp, "f"))
	}
	if err := os.RemoveAll(filepath.Join(tmp, "snap")); err != nil {
		t.Fatal(err)
	}
	if p.linked(a) {
		t.Fatal("range still linked after its image went")
	}
	if got, err := p.alloc(holder("g")); err != nil || got != a {
		t.Fatalf("range after its moved image went: %d (%v), want %d", got, err, a)
	}
	// A restarted server reads the same state.
	q := &uidPool{dir: p.dir, base: p.base, size: p.size, count: p.count}
	if _, err := q.alloc(holder("e")); err == nil {
		t.Fatal("a restarted pool handed out a range in use")
	}
	for _, bad := range []uint32{99999, 100001, 100000 + 3*65536} {
		if err := p.hold(bad, holder("x")); err == nil {
			t.Errorf("hold(%d) accepted", bad)
		}
	}
	if r, ok := p.rangeOf(100000 + 65536 + 5); !ok || r != 100000+65536 {
		t.Errorf("rangeOf = %d, %v", r, ok)
	}
	if _, ok := p.rangeOf(5); ok {
		t.Error("host uid 5 is in no range")
	}
}

func TestHostPathKeys(t *testing.T) {
	dir := t.TempDir()
	keys, err := hostkey.Load(filepath.Join(dir, secretFile))
	if err != nil {
		t.Fatal(err)
	}
	r := &Store{cfg: Config{StateDir: dir}, keys: keys}
	k := r.key("isb123")
	if !hostkey.IsKey(k) || k == r.key("isb124") {
		t.Fatalf("key %q", k)
	}
	if hk, err := HostKey(dir, "isb123"); err != nil || hk != k {
		t.Fatalf("HostKey = %q, %v; want %q", hk, err, k)
	}
	if got := r.Dir("isb123"); filepath.Base(got) != k {
		t.Fatalf("bundle dir %s is not named by the key", got)
	}
	if got := r.CgroupPath("isb123"); filepath.Base(got) != k {
		t.Fatalf("cgroup %s is not named by the key", got)
	}
	// A bundle records its id; a forged id file does not name it.
	bdir := r.Dir("isb123")
	if err := os.MkdirAll(bdir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bdir, idFile), []byte("isb123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if id, ok := r.SandboxOfCgroup(k); !ok || id != "isb123" {
		t.Fatalf("SandboxOfCgroup = %q, %v", id, ok)
	}
	if err := os.WriteFile(filepath.Join(bdir, idFile), []byte("isb999\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if id, ok := r.SandboxOfCgroup(k); ok {
		t.Fatalf("a bundle whose id file does not match its key names %q", id)
	}
	for _, bad := range []string{"", "../x", "a/b", "."} {
		if _, ok := r.SandboxOfCgroup(bad); ok {
			t.Errorf("SandboxOfCgroup(%q) answered", bad)
		}
	}
	if id, ok := r.SandboxOfContainer(k); ok {
		t.Fatalf("SandboxOfContainer of a forged bundle = %q", id)
	}
}
