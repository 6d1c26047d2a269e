package outside

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// imageRegistry is a second allowed loopback listener: a real registry
// that serves the images the unpack rows build from.
var imageRegistry net.Listener

// TestImageUnpackAttacks: the author of a build's fromImage writes its
// layers. The server unpacks them in a confined child whose root is the
// layer's directory; the build still succeeds (unsafe entries skipped)
// and nothing outside the layer changes.
func TestImageUnpackAttacks(t *testing.T) {
	s := server(t)
	if imageRegistry == nil {
		t.Fatal("no listener for the image registry")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	reg := &http.Server{Handler: registry.New(registry.Logger(log.New(io.Discard, "", 0)))}
	go reg.Serve(imageRegistry)
	t.Cleanup(func() { reg.Close() })

	outside := t.TempDir()
	victim := filepath.Join(outside, "victim")
	if err := os.WriteFile(victim, []byte("intact"), 0o644); err != nil {
		t.Fatal(err)
	}
	up := strings.Repeat("../", 24)
	rel := strings.TrimPrefix(outside, "/")
	ref := imageRegistry.Addr().String() + "/outside/tricks:v1"
	push(t, ref, []tarEntry{
		{name: "app/hello.txt", body: "hello"},
		{name: up + rel + "/escape", body: "x"},
		{name: "link", link: outside, typ: tar.TypeSymlink},
		{name: "link/victim", body: "overwritten"},
		{name: "rel", link: up + rel, typ: tar.TypeSymlink},
		{name: "rel/victim", body: "overwritten"},
		{name: "rel/escape", body: "x"},
		{name: "hard", link: up + rel + "/victim", typ: tar.TypeLink},
		{name: outside + "/escape", body: "absolute names stay inside"},
	})

	runAttacks(t, []attack{
		{sideBuild, "image layer with ../ names, symlinks to host paths and hard links out", func(t *testing.T) error {
			msg, answers, err := buildFromImage(ctx, t, s, ref)
			if b, _ := os.ReadFile(victim); string(b) != "intact" {
				return crossed("a file outside the layer was overwritten: %q", b)
			}
			if _, err := os.Lstat(filepath.Join(outside, "escape")); err == nil {
				return crossed("a file was created outside the layer")
			}
			if err != nil {
				return err
			}
			if msg != "" {
				return fmt.Errorf("the build from the image failed: %.300s", msg)
			}
			// The layer was unpacked, its unsafe entries skipped.
			if !strings.Contains(answers, "skipped unsafe entry") {
				return fmt.Errorf("the build's logs name no skipped entry: %.600s", oneLine(answers))
			}
			if _, logs, ok := strings.Cut(answers, "layer 1/1"); ok {
				t.Logf("build logs: layer 1/1%.600s", oneLine(logs))
			}
			return nil
		}},
	})
}

// tarEntry is one entry of a test layer.
type tarEntry struct {
	name, body, link string
	typ              byte
}

// push writes a one-layer image of entries to ref.
func push(t *testing.T, ref string, entries []tarEntry) {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: 0o644, ModTime: time.Unix(1700000000, 0)}
		if h.Typeflag == 0 {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(e.body))
	}
	tw.Close()
	b := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
}
