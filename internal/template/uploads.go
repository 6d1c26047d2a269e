package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// Uploaded COPY contexts (E2B build API) live per team:
// <dir>/.uploads/<team key>/<files hash>.tar plus <files hash>.json. The
// files hash is the name the client gave them (E2B's SDK hashes the COPY
// line, the paths, their stat modes and sizes, directories' included, and
// the contents: not recomputable from an archive). So the hash is only a
// name inside the team: one team never sees, and cannot use, another's
// uploads, and what the builder trusts is the SHA-256 the server computes
// over the bytes it received (Upload.Digest) and the content of the
// extracted files (the step cache key, hashSources).
const uploadsDir = ".uploads"

// MaxUploadBytes bounds one uploaded context as sent.
const MaxUploadBytes = 1 << 30

// contextLimits bound what one uploaded context unpacks to (a gzip bomb
// stops at the first limit it meets).
func contextLimits() UnpackLimits { return UnpackLimits{MaxBytes: 4 << 30, MaxFiles: 200000} }

// Upload describes an uploaded context.
type Upload struct {
	Hash      string    `json:"hash"`   // the client's files hash (its name)
	Digest    string    `json:"digest"` // SHA-256 of the bytes received
	SizeBytes int64     `json:"sizeBytes"`
	CreatedAt time.Time `json:"createdAt"`
}

func validFilesHash(h string) bool { return validLayerID(h) }

func (s *Store) uploadDir(team string) string {
	return filepath.Join(s.dir, uploadsDir, LayerKey("uploads", team)[:32])
}

func (s *Store) uploadPath(team, hash string) string {
	return filepath.Join(s.uploadDir(team), hash+".tar")
}

// HasUpload reports whether team uploaded the files named hash. Another
// team's upload of the same hash does not count.
func (s *Store) HasUpload(team, hash string) bool {
	if team == "" || !validFilesHash(hash) {
		return false
	}
	_, err := os.Stat(filepath.Join(s.uploadDir(team), hash+".json"))
	return err == nil
}

// PutUpload stores team's uploaded (gzipped or plain) tar of COPY sources
// under hash, at most maxBytes long, and returns what was stored. When
// digestMustMatch is set, hash must be the SHA-256 of the bytes (agentbox's
// own clients name their uploads that way) and a mismatch is refused.
func (s *Store) PutUpload(team, hash string, r io.Reader, maxBytes int64, digestMustMatch bool) (Upload, error) {
	if team == "" {
		return Upload{}, fmt.Errorf("uploads belong to a team: %w", errdefs.ErrInvalidArgument)
	}
	if !validFilesHash(hash) {
		return Upload{}, fmt.Errorf("files hash %q: want 64 lowercase hex digits: %w", hash, errdefs.ErrInvalidArgument)
	}
	dir := s.uploadDir(team)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Upload{}, err
	}
	f, err := os.CreateTemp(dir, ".part-*")
	if err != nil {
		return Upload{}, err
	}
	defer os.Remove(f.Name())
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(r, maxBytes+1))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Upload{}, fmt.Errorf("upload %s: %w", hash[:12], err)
	}
	if n > maxBytes {
		return Upload{}, fmt.Errorf("upload %s: more than %d bytes: %w", hash[:12], maxBytes, errdefs.ErrTooLarge)
	}
	u := Upload{Hash: hash, Digest: hex.EncodeToString(h.Sum(nil)), SizeBytes: n, CreatedAt: time.Now().UTC()}
	if digestMustMatch && u.Digest != hash {
		return Upload{}, fmt.Errorf("upload %s: the files received hash to %s, not to the hash in the upload link (%s); upload them again: %w", hash, u.Digest, hash, errdefs.ErrInvalidArgument)
	}
	b, _ := json.Marshal(u)
	meta := filepath.Join(dir, hash+".json")
	if err := os.Rename(f.Name(), s.uploadPath(team, hash)); err != nil {
		return Upload{}, err
	}
	if err := os.WriteFile(meta+".tmp", b, 0o600); err != nil {
		return Upload{}, err
	}
	return u, os.Rename(meta+".tmp", meta)
}

// extractUpload unpacks team's upload hash into dir with the layer
// unpacker (no path leaves dir: "..", absolute names, symlinked parents and
// hard links out are refused; devices and FIFOs skipped; set-id bits and
// xattrs dropped) and within the context limits.
func (s *Store) extractUpload(ctx context.Context, team, hash, dir string) error {
	if !s.HasUpload(team, hash) {
		return fmt.Errorf("files %s were not uploaded by this team (GET /templates/{id}/files/%s gives an upload link): %w", hash, hash, errdefs.ErrNotFound)
	}
	f, err := os.Open(s.uploadPath(team, hash))
	if err != nil {
		return err
	}
	defer f.Close()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	st, err := unpackArchive(ctx, f, dir, contextLimits())
	if err != nil {
		return fmt.Errorf("upload %s: %w", hash[:12], err)
	}
	if len(st.Rejected) > 0 {
		// A context is the build author's own input: an entry that tries
		// to leave it fails the build instead of being skipped quietly.
		return fmt.Errorf("upload %s: %d unsafe entries refused, first: %s: %w", hash[:12], len(st.Rejected), st.Rejected[0], errdefs.ErrInvalidArgument)
	}
	return nil
}
