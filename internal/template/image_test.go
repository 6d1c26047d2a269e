package template

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/destpolicy"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/testutil"
	"github.com/agentbox/agentbox/internal/untar"
)

// tarEntry is one entry of a test layer.
type tarEntry struct {
	name, body, link string
	typ              byte
	mode             int64
	uid              int
	major            int64
}

func layerTar(t testing.TB, entries []tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Linkname: e.link, Uid: e.uid, Gid: e.uid,
			Devmajor: e.major, ModTime: time.Unix(1700000000, 0)}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
			if h.Typeflag == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(e.body))
		}
	}
	tw.Close()
	return buf.Bytes()
}

// busyboxLayer is a layer with a static busybox as /bin/sh and friends, so
// RUN steps work without a network or a Debian bootstrap.
func busyboxLayer(t testing.TB) []byte {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Skip("needs busybox-static (/bin/busybox)")
	}
	entries := []tarEntry{
		{name: "bin/", typ: tar.TypeDir}, {name: "etc/", typ: tar.TypeDir}, {name: "tmp/", typ: tar.TypeDir, mode: 0o1777},
		{name: "bin/busybox", body: string(bb), mode: 0o755},
		{name: "etc/passwd", body: "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/home/app:/bin/sh\n"},
		{name: "etc/group", body: "root:x:0:\napp:x:1000:\n"},
		{name: "home/", typ: tar.TypeDir}, {name: "home/app/", typ: tar.TypeDir, uid: 1000},
	}
	for _, tool := range []string{"sh", "cat", "echo", "ls", "mkdir", "rm", "id", "stat", "touch", "test", "env", "sleep", "true", "false", "pwd", "wc", "sed"} {
		entries = append(entries, tarEntry{name: "bin/" + tool, typ: tar.TypeLink, link: "bin/busybox"})
	}
	return layerTar(t, entries)
}

func imageOf(t testing.TB, layers [][]byte, cfg v1.Config) v1.Image {
	t.Helper()
	img := empty.Image
	for _, l := range layers {
		layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(l)), nil })
		if err != nil {
			t.Fatal(err)
		}
		if img, err = mutate.AppendLayers(img, layer); err != nil {
			t.Fatal(err)
		}
	}
	img, err := mutate.Config(img, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func newTestStore(t testing.TB) *Store {
	t.Helper()
	s, err := NewStore(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// readInTemplate reads rel from the topmost layer of tpl that has it, the
// way the overlay would.
func readInTemplate(t testing.TB, tpl *Template, rel string) (string, os.FileInfo, bool) {
	t.Helper()
	for _, l := range slices.Backward(tpl.Layers) {
		fi, err := os.Lstat(filepath.Join(l, rel))
		if err != nil {
			continue
		}
		if fi.Mode()&os.ModeCharDevice != 0 {
			return "", fi, false // whiteout
		}
		b, _ := os.ReadFile(filepath.Join(l, rel))
		return string(b), fi, true
	}
	return "", nil, false
}

func TestImageSources(t *testing.T) {
	testutil.RequireRoot(t)
	ctx := context.Background()
	img := imageOf(t, [][]byte{
		layerTar(t, []tarEntry{{name: "etc/", typ: tar.TypeDir}, {name: "etc/os", body: "one"}, {name: "gone", body: "x"},
			{name: "opq/", typ: tar.TypeDir}, {name: "opq/old", body: "old"}}),
		layerTar(t, []tarEntry{{name: "etc/os", body: "two"}, {name: ".wh.gone"}, {name: "opq/", typ: tar.TypeDir},
			{name: "opq/.wh..wh..opq"}, {name: "opq/new", body: "new"}}),
	}, v1.Config{Env: []string{"A=1"}, WorkingDir: "/srv", User: "1000", Cmd: []string{"serve", "--port", "8080"},
		ExposedPorts: map[string]struct{}{"8080/tcp": {}}})

	dir := t.TempDir()
	layoutDir := filepath.Join(dir, "layout")
	lp, err := layout.Write(layoutDir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(dir, "image.tar")
	tag, _ := name.NewTag("example.com/app:v1")
	if err := tarball.WriteToFile(archive, tag, img); err != nil {
		t.Fatal(err)
	}
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	ref := strings.TrimPrefix(reg.URL, "http://") + "/team/app:v1"
	rref, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(rref, img); err != nil {
		t.Fatal(err)
	}

	s := newTestStore(t)
	s.SetFetchPolicy(allowPolicy(t, strings.TrimPrefix(reg.URL, "http://")))
	for _, src := range []string{SourceOCILayout + layoutDir, SourceDockerArchive + archive, ref} {
		t.Run(strings.SplitN(src, ":", 2)[0], func(t *testing.T) {
			var log bytes.Buffer
			tpl, err := s.BuildFromSpec(ctx, BuildSpec{Name: "img", Tag: strings.NewReplacer(":", "-", "/", "-", ".", "-").Replace(src)[:20], From: src, FromImage: true, LocalImages: true}, &log)
			if err != nil {
				t.Fatalf("%v\n%s", err, log.String())
			}
			if body, _, _ := readInTemplate(t, tpl, "etc/os"); body != "two" {
				t.Errorf("etc/os = %q, want the upper layer's", body)
			}
			if _, _, ok := readInTemplate(t, tpl, "gone"); ok {
				t.Error("whited-out file still visible")
			}
			top := tpl.Layers[1] // the second image layer
			if v, err := unix.Lgetxattr(filepath.Join(top, "opq"), "trusted.overlay.opaque", make([]byte, 8)); err != nil || v != 1 {
				t.Errorf("opq not marked opaque: %v", err)
			}
			if tpl.DefaultUser != "1000" || tpl.DefaultWorkdir != "/srv" || tpl.Env["A"] != "1" || tpl.StartCmd != "serve --port 8080" ||
				!slices.Equal(tpl.ExposedPorts, []int{8080}) {
				t.Errorf("config not carried over: %+v", tpl)
			}
		})
	}
	// The three sources are one image: its layers are stored once.
	layers, _ := s.ListLayers(ctx)
	if len(layers) != 3 { // two image layers + the finalize layer
		t.Errorf("%d layers in the store, want 3", len(layers))
	}
}

// allowPolicy is the destination policy with dest opened.
func allowPolicy(t *testing.T, dest ...string) *destpolicy.Policy {
	t.Helper()
	var cfg destpolicy.Config
	for _, d := range dest {
		a, err := destpolicy.ParseAllowed(d)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Allow = append(cfg.Allow, a)
	}
	return destpolicy.New(cfg)
}

func TestUnreachableRegistry(t *testing.T) {
	testutil.RequireRoot(t)
	s := newTestStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Loopback is closed unless the operator opens it.
	_, err := s.BuildFromSpec(ctx, BuildSpec{Name: "x", From: "127.0.0.1:1/nothing/here:v1", FromImage: true}, nil)
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "fromImage registry 127.0.0.1:1 is a loopback address") ||
		!strings.Contains(err.Error(), "--fetch-allow") {
		t.Fatalf("got %v, want the policy's refusal", err)
	}
	s.SetFetchPolicy(allowPolicy(t, "127.0.0.1:1"))
	_, err = s.BuildFromSpec(ctx, BuildSpec{Name: "x", From: "127.0.0.1:1/nothing/here:v1", FromImage: true}, nil)
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Fatalf("got %v, want ErrUnavailable naming the registry", err)
	}
	if ts, _ := s.ListAll(ctx); len(ts) != 0 {
		t.Errorf("failed build left templates: %v", ts)
	}
}

// TestHostileLayerNeutralised: in the server's confined child as in
// process, no entry of a hostile layer lands outside it.
func TestHostileLayerNeutralised(t *testing.T) {
	testutil.RequireRoot(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range []struct {
		name   string
		unpack func(r io.Reader, dir string) (unpackStats, error)
	}{
		{"in process", func(r io.Reader, dir string) (unpackStats, error) { return unpackLayer(context.Background(), r, dir) }},
		{"confined", func(r io.Reader, dir string) (unpackStats, error) {
			return confinedUnpack(context.Background(), self, r, dir, untar.Limits{})
		}},
	} {
		t.Run(u.name, func(t *testing.T) { testHostileLayer(t, u.unpack) })
	}
}

func testHostileLayer(t *testing.T, unpack func(io.Reader, string) (unpackStats, error)) {
	outside := t.TempDir()
	victim := filepath.Join(outside, "victim")
	if err := os.WriteFile(victim, []byte("intact"), 0o644); err != nil {
		t.Fatal(err)
	}
	hostile := layerTar(t, []tarEntry{
		{name: "../escape", body: "x"},
		{name: "a/../../escape2", body: "x"},
		{name: "/abs", body: "absolute names stay inside"},
		{name: "link", typ: tar.TypeSymlink, link: outside},
		{name: "link/victim", body: "overwritten"},
		{name: "rel", typ: tar.TypeSymlink, link: "../../../../../../" + strings.TrimPrefix(outside, "/")},
		{name: "rel/victim", body: "overwritten"},
		{name: "hard", typ: tar.TypeLink, link: "../../../../../../" + strings.TrimPrefix(victim, "/")},
		{name: "hard2", typ: tar.TypeLink, link: "link/victim"},
		{name: "dev/sda", typ: tar.TypeBlock, major: 8},
		{name: "dev/mem", typ: tar.TypeChar, major: 1},
		{name: "suid", body: "#!/bin/sh", mode: 0o4755},
		{name: "sgid", body: "#!/bin/sh", mode: 0o2755},
		{name: "owned", body: "x", uid: 1234},
	})
	dst := t.TempDir()
	st, err := unpack(bytes.NewReader(hostile), dst)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "intact" {
		t.Fatalf("file outside the layer was written: %q", b)
	}
	for _, p := range []string{filepath.Join(filepath.Dir(dst), "escape"), filepath.Join(filepath.Dir(filepath.Dir(dst)), "escape2")} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s created outside the layer", p)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "abs")); string(b) != "absolute names stay inside" {
		t.Errorf("absolute name not placed inside: %q", b)
	}
	for _, p := range []string{"dev/sda", "dev/mem", "hard", "hard2"} {
		if _, err := os.Lstat(filepath.Join(dst, p)); err == nil {
			t.Errorf("%s was created", p)
		}
	}
	for _, p := range []string{"suid", "sgid"} {
		fi, err := os.Stat(filepath.Join(dst, p))
		if err != nil || fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 {
			t.Errorf("%s: %v, mode %v: set-id bit kept", p, err, fi.Mode())
		}
	}
	var sst unix.Stat_t
	if err := unix.Stat(filepath.Join(dst, "owned"), &sst); err != nil || sst.Uid != 1234 {
		t.Errorf("owner not kept numerically: %v uid %d", err, sst.Uid)
	}
	if st.SetuidStripped != 2 || len(st.Rejected) < 7 {
		t.Errorf("stats %+v", st)
	}
}
