package objstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// fakeS3 serves an in-memory S3 over a real HTTP listener, with bucket b.
func fakeS3(t *testing.T) (url string, raw *minio.Client) {
	t.Helper()
	srv := httptest.NewServer(gofakes3.New(s3mem.New(), gofakes3.WithLogger(gofakes3.DiscardLog())).Server())
	t.Cleanup(srv.Close)
	c, err := minio.New(srv.Listener.Addr().String(), &minio.Options{Creds: credentials.NewStaticV4("id", "secret", ""), BucketLookup: minio.BucketLookupPath})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.MakeBucket(context.Background(), "bkt", minio.MakeBucketOptions{}); err != nil {
		t.Fatal(err)
	}
	return srv.URL + "/bkt/images", c
}

func TestImageRoundTrip(t *testing.T) {
	ctx := context.Background()
	url, raw := fakeS3(t)
	key := make([]byte, KeySize)
	_, _ = rand.Read(key)
	s, err := Open(ctx, Config{URL: url, AccessKey: "id", SecretKey: "secret", Key: key})
	if err != nil {
		t.Fatal(err)
	}
	src := t.TempDir()
	big := make([]byte, 3*ChunkSize+17)
	_, _ = rand.Read(big)
	if err := os.WriteFile(filepath.Join(src, "pages.img"), big, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(src, "upper", "tmp"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "upper", "tmp", "note"), []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	b := Binding{Team: "agents", Sandbox: "uid-1"}
	prefix := ImagePrefix("agents", "sb1", 3)
	if err := s.PutImage(ctx, prefix, b, src, Manifest{SandboxID: "sb1", Node: "node-a", Generation: 3, Record: []byte(`{"x":1}`)}); err != nil {
		t.Fatal(err)
	}
	// The bucket never holds plaintext.
	obj, err := raw.GetObject(ctx, "bkt", "images/"+prefix+imageObject, minio.GetObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := io.ReadAll(obj)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(sealed, big[:256]) || bytes.Contains(sealed, []byte("hello")) {
		t.Fatal("the bucket holds plaintext")
	}

	dst := t.TempDir()
	m, err := s.GetImage(ctx, prefix, b, dst)
	if err != nil {
		t.Fatal(err)
	}
	if m.SandboxID != "sb1" || m.Generation != 3 || string(m.Record) != `{"x":1}` {
		t.Fatalf("manifest %+v", m)
	}
	got, err := os.ReadFile(filepath.Join(dst, "pages.img"))
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("pages.img differs after the round trip: %v", err)
	}
	if got, _ := os.ReadFile(filepath.Join(dst, "upper", "tmp", "note")); string(got) != "hello" {
		t.Fatalf("note = %q", got)
	}

	// Another tenant's Sandbox cannot open it, even with the objects copied.
	if _, err := s.GetImage(ctx, prefix, Binding{Team: "team-b", Sandbox: "uid-1"}, t.TempDir()); !errors.Is(err, ErrIntegrity) {
		t.Fatalf("open as another team: err = %v, want ErrIntegrity", err)
	}
	// A flipped byte in the bucket is refused.
	sealed[len(sealed)-40] ^= 0x80
	if _, err := raw.PutObject(ctx, "bkt", "images/"+prefix+imageObject, bytes.NewReader(sealed), int64(len(sealed)), minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetImage(ctx, prefix, b, t.TempDir()); !errors.Is(err, ErrIntegrity) {
		t.Fatalf("open tampered: err = %v, want ErrIntegrity", err)
	}

	if err := s.DeletePrefix(ctx, "agents/sb1/"); err != nil {
		t.Fatal(err)
	}
	for o := range raw.ListObjects(ctx, "bkt", minio.ListObjectsOptions{Recursive: true}) {
		t.Errorf("left in the bucket after delete: %s %v", o.Key, o.Err)
	}
}
