package objstore

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/agentbox/agentbox/internal/untar"
)

// Config says where the bucket is and how to reach it.
type Config struct {
	// URL is http(s)://host[:port]/bucket[/prefix] (path-style addressing).
	URL string
	// AccessKey and SecretKey sign the requests (S3 v4).
	AccessKey, SecretKey string
	// Key seals every object (KeySize bytes).
	Key []byte
}

// Store is a bucket (and key prefix) holding sealed images.
type Store struct {
	c      *minio.Client
	bucket string
	prefix string
	key    []byte
	// Limits bound what an image unpacks to (zero: the defaults).
	Limits untar.Limits
	// Self is the server's binary, which unpacks images confined
	// (UnpackHook); "" unpacks them in this process.
	Self string
}

// Open connects to the bucket and checks that it exists.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--kube-object-store %q: want http(s)://host[:port]/bucket[/prefix]", cfg.URL)
	}
	bucket, prefix, _ := strings.Cut(strings.Trim(u.Path, "/"), "/")
	if bucket == "" {
		return nil, fmt.Errorf("--kube-object-store %q: name the bucket in the path (http(s)://host[:port]/bucket)", cfg.URL)
	}
	if cfg.AccessKey == "" || cfg.SecretKey == "" {
		return nil, errors.New("--kube-object-store: no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY or pass --kube-object-store-credentials-file")
	}
	if len(cfg.Key) != KeySize {
		return nil, fmt.Errorf("--kube-object-store-key-file: want a %d-byte key", KeySize)
	}
	c, err := minio.New(u.Host, &minio.Options{
		Creds:        credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, ""),
		Secure:       u.Scheme == "https",
		BucketLookup: minio.BucketLookupPath,
	})
	if err != nil {
		return nil, fmt.Errorf("--kube-object-store %q: %w", cfg.URL, err)
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ok, err := c.BucketExists(cctx, bucket)
	if err != nil {
		return nil, fmt.Errorf("--kube-object-store %q: %w", cfg.URL, err)
	}
	if !ok {
		return nil, fmt.Errorf("--kube-object-store %q: bucket %s does not exist; create it", cfg.URL, bucket)
	}
	if prefix != "" {
		prefix += "/"
	}
	return &Store{c: c, bucket: bucket, prefix: prefix, key: cfg.Key}, nil
}

// LoadCredentials reads AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY lines
// (KEY=VALUE) from a file private to its owner.
func LoadCredentials(path string) (access, secret string, err error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", "", fmt.Errorf("--kube-object-store-credentials-file: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return "", "", fmt.Errorf("--kube-object-store-credentials-file %s: mode %04o lets other users read it; chmod 0600 it", path, st.Mode().Perm())
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return "", "", fmt.Errorf("--kube-object-store-credentials-file: %w", err)
	}
	for line := range strings.Lines(string(raw)) {
		k, v, _ := strings.Cut(strings.TrimSpace(line), "=")
		switch strings.TrimSpace(k) {
		case "AWS_ACCESS_KEY_ID":
			access = strings.TrimSpace(v)
		case "AWS_SECRET_ACCESS_KEY":
			secret = strings.TrimSpace(v)
		}
	}
	if access == "" || secret == "" {
		return "", "", fmt.Errorf("--kube-object-store-credentials-file %s: want AWS_ACCESS_KEY_ID=... and AWS_SECRET_ACCESS_KEY=... lines", path)
	}
	return access, secret, nil
}

// Put seals r as object name (relative to the store's prefix) for b.
func (s *Store) Put(ctx context.Context, name string, b Binding, r io.Reader) error {
	b.Object = name
	pr, pw := io.Pipe()
	go func() {
		w, err := NewWriter(pw, s.key, b)
		if err == nil {
			_, err = io.Copy(w, r)
		}
		if err == nil {
			err = w.Close()
		}
		pw.CloseWithError(err)
	}()
	_, err := s.c.PutObject(ctx, s.bucket, s.prefix+name, pr, -1, minio.PutObjectOptions{
		PartSize: 16 << 20, ContentType: "application/octet-stream",
		// The seal authenticates every byte; an unsigned payload also
		// works with servers that do not speak S3's streaming signatures.
		DisableContentSha256: true,
	})
	pr.CloseWithError(err)
	if err != nil {
		return fmt.Errorf("upload %s: %w", name, err)
	}
	return nil
}

// Get opens object name for b: the reader returns authenticated bytes
// only, and fails with ErrIntegrity on anything else.
func (s *Store) Get(ctx context.Context, name string, b Binding) (io.ReadCloser, error) {
	b.Object = name
	obj, err := s.c.GetObject(ctx, s.bucket, s.prefix+name, minio.GetObjectOptions{})
	if err != nil {
		return nil, fmt.Errorf("download %s: %w", name, err)
	}
	return struct {
		io.Reader
		io.Closer
	}{NewReader(obj, s.key, b), obj}, nil
}

// DeletePrefix removes every object whose name starts with prefix.
func (s *Store) DeletePrefix(ctx context.Context, prefix string) error {
	var errs []error
	for o := range s.c.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: s.prefix + prefix, Recursive: true}) {
		if o.Err != nil {
			return fmt.Errorf("list %s: %w", prefix, o.Err)
		}
		if err := s.c.RemoveObject(ctx, s.bucket, o.Key, minio.RemoveObjectOptions{}); err != nil {
			errs = append(errs, fmt.Errorf("delete %s: %w", o.Key, err))
		}
	}
	return errors.Join(errs...)
}

// Manifest describes one stored image; it is sealed like the image and
// written last, so its presence marks a complete upload.
type Manifest struct {
	Version    int       `json:"version"`
	Team       string    `json:"team"`
	Sandbox    string    `json:"sandbox"`
	SandboxID  string    `json:"sandboxID"`
	Node       string    `json:"node"`
	Generation int64     `json:"generation"`
	CreatedAt  time.Time `json:"createdAt"`
	// Image is the object holding the tar of the image directory.
	Image  string `json:"image"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
	// Record is what the restore needs besides the files (the sandbox's
	// snapshot record).
	Record json.RawMessage `json:"record"`
}

const (
	manifestObject = "manifest"
	imageObject    = "image.tar"
)

// tarFlags keep owners, modes, xattrs (overlay markers), devices
// (whiteouts) and holes.
var tarFlags = []string{"--xattrs", "--xattrs-include=*", "--numeric-owner", "--sparse"}

// PutImage uploads the tree at dir and then its manifest under prefix.
func (s *Store) PutImage(ctx context.Context, prefix string, b Binding, dir string, m Manifest) error {
	cmd := exec.CommandContext(ctx, "tar", append(append([]string{"-C", dir, "-c"}, tarFlags...), ".")...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("tar %s: %w", dir, err)
	}
	h := sha256.New()
	cnt := &counter{}
	perr := s.Put(ctx, prefix+imageObject, b, io.TeeReader(bufio.NewReaderSize(out, 1<<20), io.MultiWriter(h, cnt)))
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("tar %s: %w: %s", dir, err, bytes.TrimSpace(stderr.Bytes()))
	}
	if perr != nil {
		return perr
	}
	m.Version, m.Image, m.Size, m.SHA256 = 1, prefix+imageObject, cnt.n, hex.EncodeToString(h.Sum(nil))
	m.Team, m.Sandbox = b.Team, b.Sandbox
	raw, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return s.Put(ctx, prefix+manifestObject, b, bytes.NewReader(raw))
}

type counter struct{ n int64 }

func (c *counter) Write(p []byte) (int, error) { c.n += int64(len(p)); return len(p), nil }

// srcReader keeps the error of the stream it reads, apart from what its
// reader makes of the bytes.
type srcReader struct {
	r   io.Reader
	err error
}

func (s *srcReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		s.err = err
	}
	return n, err
}

// GetImage downloads the image under prefix into dir (which must exist and
// be empty) after checking its manifest, and unpacks it with Unpack (in
// the confined child of UnpackHook when Self is set): the files are what a
// sandbox wrote, so no host tool parses them. Any
// tampering fails with ErrIntegrity, an unsafe or oversized entry with
// ErrUnsafeImage; the caller removes dir on error.
func (s *Store) GetImage(ctx context.Context, prefix string, b Binding, dir string) (*Manifest, error) {
	mr, err := s.Get(ctx, prefix+manifestObject, b)
	if err != nil {
		return nil, err
	}
	raw, err := io.ReadAll(io.LimitReader(mr, 16<<20))
	mr.Close()
	if err != nil {
		return nil, fmt.Errorf("manifest of %s: %w", prefix, err)
	}
	var m Manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("manifest of %s: %w", prefix, err)
	}
	if m.Version != 1 || m.Team != b.Team || m.Sandbox != b.Sandbox || m.Image != prefix+imageObject {
		return nil, fmt.Errorf("manifest of %s names team %q sandbox %q image %q: %w", prefix, m.Team, m.Sandbox, m.Image, ErrIntegrity)
	}
	ir, err := s.Get(ctx, m.Image, b)
	if err != nil {
		return nil, err
	}
	defer ir.Close()
	h := sha256.New()
	cnt := &counter{}
	src := &srcReader{r: io.TeeReader(ir, io.MultiWriter(h, cnt))}
	var uerr error
	if s.Self != "" {
		uerr = unpackConfined(ctx, s.Self, src, dir, s.Limits)
	} else {
		uerr = Unpack(ctx, src, dir, s.Limits)
	}
	if uerr == nil {
		// The rest (the tar's end blocks) belongs to the digest.
		_, uerr = io.Copy(io.Discard, src)
	}
	// A stream that fails its seal is tampering, whatever the unpacker
	// made of the bytes before.
	if src.err != nil {
		if errors.Is(src.err, ErrIntegrity) {
			return nil, src.err
		}
		return nil, fmt.Errorf("download %s: %w", m.Image, src.err)
	}
	if uerr == nil && (cnt.n != m.Size || hex.EncodeToString(h.Sum(nil)) != m.SHA256) {
		return nil, fmt.Errorf("image %s: %d bytes that do not match its manifest: %w", m.Image, cnt.n, ErrIntegrity)
	}
	if uerr != nil {
		return nil, fmt.Errorf("unpack %s: %w", m.Image, uerr)
	}
	return &m, nil
}

// ImagePrefix is where generation gen of a Sandbox's image lives.
func ImagePrefix(team, sandboxID string, gen int64) string {
	return fmt.Sprintf("%s/%s/%d/", team, sandboxID, gen)
}
