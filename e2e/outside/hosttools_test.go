package outside

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/agentbox/agentbox/e2e/harness"
	"github.com/agentbox/agentbox/internal/confine"
	"github.com/agentbox/agentbox/internal/objstore"
	"github.com/agentbox/agentbox/internal/runtime/microvm"
)

// sideStoredImage is what a node reads back from the object store when it
// restores a snapshot or a moved sandbox: the files a sandbox wrote in its
// writable layer, as a tar (sealed by a node, so a forged one also needs
// the store's key).
const sideStoredImage = "stored image"

// hostTar is one entry of a crafted image tar.
type hostTar struct {
	name, body, link string
	typ              byte
	major, minor     int64
	size             int64 // a declared size whose content never comes
}

func craftImage(t *testing.T, entries ...hostTar) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: 0o644, Size: int64(len(e.body)),
			Devmajor: e.major, Devminor: e.minor, ModTime: time.Unix(0, 0)}
		switch h.Typeflag {
		case 0:
			h.Typeflag = tar.TypeReg
		case tar.TypeDir:
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
			return buf.Bytes()
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

// storeWith seals raw as the image of a snapshot in an S3 store, with a
// manifest that matches it (as PutImage names the objects), and returns
// the store (unpacking through the server binary's hook), the prefix and
// the binding that open it.
func storeWith(t *testing.T, raw []byte) (*objstore.Store, string, objstore.Binding) {
	t.Helper()
	ctx := context.Background()
	srv := httptest.NewServer(gofakes3.New(s3mem.New(), gofakes3.WithLogger(gofakes3.DiscardLog())).Server())
	t.Cleanup(srv.Close)
	c, err := minio.New(srv.Listener.Addr().String(), &minio.Options{Creds: credentials.NewStaticV4("id", "secret", ""), BucketLookup: minio.BucketLookupPath})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.MakeBucket(ctx, "images", minio.MakeBucketOptions{}); err != nil {
		t.Fatal(err)
	}
	key := make([]byte, objstore.KeySize)
	_, _ = rand.Read(key)
	s, err := objstore.Open(ctx, objstore.Config{URL: srv.URL + "/images", AccessKey: "id", SecretKey: "secret", Key: key})
	if err != nil {
		t.Fatal(err)
	}
	// As the server does: images unpack in its confined child.
	s.Self, _ = harness.Binaries(t)
	b := objstore.Binding{Team: "agents", Sandbox: "uid-1"}
	prefix := objstore.ImagePrefix("agents", "sb1", 1)
	if err := s.Put(ctx, prefix+"image.tar", b, bytes.NewReader(raw)); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(raw)
	m, _ := json.Marshal(objstore.Manifest{Version: 1, Team: b.Team, Sandbox: b.Sandbox, SandboxID: "sb1", Generation: 1,
		Image: prefix + "image.tar", Size: int64(len(raw)), SHA256: hex.EncodeToString(sum[:]), Record: []byte(`{}`)})
	if err := s.Put(ctx, prefix+"manifest", b, bytes.NewReader(m)); err != nil {
		t.Fatal(err)
	}
	return s, prefix, b
}

// TestStoredImageAttacks: a snapshot image's tar is unpacked by the node
// that restores it, as root. Each crafted image must fail to import with
// a clear error and leave the host as it was.
func TestStoredImageAttacks(t *testing.T) {
	harness.RequireRoot(t)
	sparse := t.TempDir()
	if err := os.WriteFile(filepath.Join(sparse, "hole"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(sparse, "hole"), 1<<40); err != nil {
		t.Fatal(err)
	}
	sparseTar, err := exec.Command("tar", "-C", sparse, "-c", "--sparse", "--numeric-owner", ".").Output()
	if err != nil {
		t.Fatalf("tar --sparse: %v", err)
	}
	var bomb bytes.Buffer
	zw := gzip.NewWriter(&bomb)
	tw := tar.NewWriter(zw)
	_ = tw.WriteHeader(&tar.Header{Name: "zeros", Mode: 0o644, Size: 1 << 30, Typeflag: tar.TypeReg})
	zero := make([]byte, 1<<20)
	for range 1024 {
		_, _ = tw.Write(zero)
	}
	_ = tw.Close()
	_ = zw.Close()

	// import unpacks the image made for a fresh host dir outside, with a
	// file victim in it, as a node would, and says what crossed.
	importImage := func(t *testing.T, image func(outside, victim string) []byte) error {
		outside := t.TempDir()
		victim := filepath.Join(outside, "victim")
		if err := os.WriteFile(victim, []byte("intact"), 0o644); err != nil {
			t.Fatal(err)
		}
		s, prefix, b := storeWith(t, image(outside, victim))
		dir := filepath.Join(t.TempDir(), "snap")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		_, ierr := s.GetImage(context.Background(), prefix, b, dir)
		if got, _ := os.ReadFile(victim); string(got) != "intact" {
			return crossed("a host file was overwritten: %q", got)
		}
		if es, _ := os.ReadDir(outside); len(es) != 1 {
			return crossed("%d entries made outside the image directory", len(es)-1)
		}
		if fi, err := os.Stat(victim); err == nil && fi.Sys().(*syscall.Stat_t).Nlink != 1 {
			return crossed("a hard link to a host file was made")
		}
		var found error
		_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil || found != nil {
				return nil
			}
			fi, err := d.Info()
			if err != nil {
				return nil
			}
			st := fi.Sys().(*syscall.Stat_t)
			switch {
			case fi.Mode()&(fs.ModeDevice|fs.ModeCharDevice) != 0 && st.Rdev != 0:
				found = crossed("device node %s (%d) made", d.Name(), st.Rdev)
			case fi.Size() >= 1<<30:
				found = crossed("%s of %d bytes made", d.Name(), fi.Size())
			}
			return nil
		})
		if found != nil {
			return found
		}
		if ierr == nil {
			return crossed("the image was imported")
		}
		if !errors.Is(ierr, objstore.ErrUnsafeImage) {
			return fmt.Errorf("refused for another reason: %w", ierr)
		}
		t.Logf("refused: %v", ierr)
		return nil
	}
	up := func(outside string) string { return strings.Repeat("../", 24) + strings.TrimPrefix(outside, "/") }
	fixed := func(raw []byte) func(string, string) []byte { return func(string, string) []byte { return raw } }
	rows := []struct {
		name  string
		image func(outside, victim string) []byte
	}{
		{"image tar with ../ names", func(outside, _ string) []byte {
			return craftImage(t, hostTar{name: up(outside) + "/escape", body: "x"})
		}},
		{"image tar with absolute names", func(outside, _ string) []byte {
			return craftImage(t, hostTar{name: outside + "/escape", body: "x"})
		}},
		{"image tar: symlink to a host dir, then a file through it", func(outside, _ string) []byte {
			return craftImage(t,
				hostTar{name: "upper", typ: tar.TypeDir},
				hostTar{name: "upper/link", link: outside, typ: tar.TypeSymlink},
				hostTar{name: "upper/link/victim", body: "overwritten"})
		}},
		{"image tar: hard link to a host file", func(_, victim string) []byte {
			return craftImage(t, hostTar{name: "hard", link: victim, typ: tar.TypeLink})
		}},
		{"image tar: device node", fixed(craftImage(t, hostTar{name: "mem", typ: tar.TypeChar, major: 1, minor: 1}))},
		{"image tar: huge sparse file", fixed(sparseTar)},
		{"image tar: decompression bomb", fixed(bomb.Bytes())},
	}
	var attacks []attack
	for _, r := range rows {
		attacks = append(attacks, attack{side: sideStoredImage, name: r.name, run: func(t *testing.T) error { return importImage(t, r.image) }})
	}
	runAttacks(t, attacks)
}

// TestRootImageToolAttacks: mkfs.ext4 copies a template's files (a build
// input's writing) into a microVM's root image. Were a crafted tree to
// take mkfs over, the confined run it gets (microvm.MkfsTool, through
// the server's own `agentbox __hook confine`) still reads nothing but the
// tree and writes nothing but the image, within its size. The rows run
// that exact confinement with the taken-over tool's moves as its command.
func TestRootImageToolAttacks(t *testing.T) {
	harness.RequireRoot(t)
	self, _ := harness.Binaries(t)
	const uid = 0x6ffe0101 // owns nothing on the host
	host := t.TempDir()
	secret := filepath.Join(host, "secret")
	if err := os.WriteFile(secret, []byte("host-secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	tree := t.TempDir()
	if err := os.Symlink(secret, filepath.Join(tree, "secret")); err != nil {
		t.Fatal(err)
	}
	const mb = 16
	// run runs argv in the jail mkfs gets for tree and an image of mb MiB.
	run := func(t *testing.T, argv ...string) (string, *os.File, error) {
		img, err := os.OpenFile(filepath.Join(t.TempDir(), "root.ext4"), os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { img.Close() })
		if err := img.Truncate(mb << 20); err != nil {
			t.Fatal(err)
		}
		if err := img.Chown(uid, uid); err != nil {
			t.Fatal(err)
		}
		d, err := os.Open(tree)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		tool, err := microvm.MkfsTool(self, uid, img, d, mb)
		if err != nil {
			t.Fatal(err)
		}
		tool.Argv = argv
		out, err := tool.Run(context.Background())
		return string(out), img, err
	}
	runAttacks(t, []attack{
		{sideBuild, "root image tool follows a template symlink to a host file", func(t *testing.T) error {
			out, _, _ := run(t, "/bin/cat", filepath.Join(confine.FD(1), "secret"))
			if strings.Contains(out, "host-secret") {
				return crossed("read the host file through the template's symlink")
			}
			return nil
		}},
		{sideBuild, "root image tool writes a host file", func(t *testing.T) error {
			planted := filepath.Join(host, "planted")
			_, _, _ = run(t, "/usr/bin/touch", planted)
			if _, err := os.Lstat(planted); err == nil {
				return crossed("made %s", planted)
			}
			return nil
		}},
		{sideBuild, "root image tool writes past the image's size (oversized tree)", func(t *testing.T) error {
			_, img, _ := run(t, "/bin/dd", "if=/dev/zero", "of="+confine.FD(0), "bs=1M", fmt.Sprint("count=", 2*mb), "conv=notrunc")
			fi, err := img.Stat()
			if err != nil {
				return err
			}
			if fi.Size() > mb<<20 {
				return crossed("the image grew to %d bytes", fi.Size())
			}
			return nil
		}},
		{sideBuild, "root image tool reaches the network", func(t *testing.T) error {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return err
			}
			defer l.Close()
			out, _, err := run(t, "/bin/bash", "-c", "exec 3<>/dev/tcp/"+strings.Replace(l.Addr().String(), ":", "/", 1)+" && echo connected")
			if err == nil && strings.Contains(out, "connected") {
				return crossed("opened a TCP connection")
			}
			return nil
		}},
	})
}
