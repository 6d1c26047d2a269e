package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/untar"
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
// stops at the first limit it meets): the store's limits, within 4 GiB
// and 200,000 entries.
func (s *Store) contextLimits() untar.Limits {
	l := s.unpack.Or(DefaultUnpackLimits())
	l.MaxBytes = min(l.MaxBytes, 4<<30)
	l.MaxEntries = min(l.MaxEntries, 200000)
	return l
}

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
// team's upload of the same hash does not count. Asking counts as a use: an
// upload a client is told is present does not expire for another
// UploadLimits.TTL.
func (s *Store) HasUpload(team, hash string) bool {
	if team == "" || !validFilesHash(hash) {
		return false
	}
	meta := filepath.Join(s.uploadDir(team), hash+".json")
	if _, err := os.Stat(meta); err != nil {
		return false
	}
	now := time.Now()
	_ = os.Chtimes(meta, now, now)
	return true
}

// PutUpload stores team's uploaded (gzipped or plain) tar of COPY sources
// under hash, at most maxBytes long, and returns what was stored. When
// digestMustMatch is set, hash must be the SHA-256 of the bytes (agentbox's
// own clients name their uploads that way) and a mismatch is refused. The
// bytes count toward the team's upload quota as they arrive: an upload
// that would pass it is cut off and refused (ErrResourceExhausted).
func (s *Store) PutUpload(team, hash string, r io.Reader, maxBytes int64, digestMustMatch bool) (Upload, error) {
	u, err := s.putUpload(team, hash, r, maxBytes, digestMustMatch)
	return u, s.explainDisk("store an upload", err)
}

func (s *Store) putUpload(team, hash string, r io.Reader, maxBytes int64, digestMustMatch bool) (Upload, error) {
	if team == "" {
		return Upload{}, fmt.Errorf("uploads belong to a team: %w", errdefs.ErrInvalidArgument)
	}
	if !validFilesHash(hash) {
		return Upload{}, fmt.Errorf("files hash %q: want 64 lowercase hex digits: %w", hash, errdefs.ErrInvalidArgument)
	}
	if err := s.admitDisk("store an upload"); err != nil {
		return Upload{}, err
	}
	dir := s.uploadDir(team)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Upload{}, err
	}
	if err := s.uploads.take(dir, 0); err != nil {
		return Upload{}, err
	}
	f, err := os.CreateTemp(dir, s.partPrefix()+"*")
	if err != nil {
		return Upload{}, err
	}
	defer os.Remove(f.Name())
	h := sha256.New()
	counted := &quotaWriter{ledger: &s.uploads, dir: dir}
	// Whatever is counted and not kept is given back.
	kept := false
	defer func() {
		if !kept {
			s.uploads.give(dir, counted.n)
		}
	}()
	n, err := io.Copy(io.MultiWriter(counted, f, h), io.LimitReader(r, maxBytes+1))
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
	tar := s.uploadPath(team, hash)
	// The file this one replaces (an upload of the same hash) no longer
	// counts.
	if old, err := os.Stat(tar); err == nil {
		s.uploads.give(dir, old.Size())
	}
	s.crash.After(OpUpload, StepUploadReceived)
	if err := os.Rename(f.Name(), tar); err != nil {
		return Upload{}, err
	}
	kept = true
	s.crash.After(OpUpload, StepUploadRenamed)
	if err := os.WriteFile(meta+".tmp", b, 0o600); err != nil {
		return Upload{}, err
	}
	if err := os.Rename(meta+".tmp", meta); err != nil {
		return Upload{}, err
	}
	s.crash.After(OpUpload, StepUploadCommitted)
	return u, nil
}

// CheckUploadRoom refuses an upload of size bytes (the Content-Length a
// client declared) that cannot fit in team's upload quota, before any of it
// is read. PutUpload counts the bytes themselves as they arrive.
func (s *Store) CheckUploadRoom(team string, size int64) error {
	return s.uploads.room(s.uploadDir(team), size)
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
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("files %s were removed while the build waited (uploads no build uses expire; agentbox serve --upload-ttl): upload them again: %w", hash, errdefs.ErrNotFound)
	}
	if err != nil {
		return err
	}
	defer f.Close()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	st, err := s.unpackArchive(ctx, f, dir, s.contextLimits())
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

// ---- the per-team upload quota and expiry ----

// Defaults of UploadLimits.
const (
	DefaultUploadTeamMB = 256
	DefaultUploadTTL    = time.Hour
)

// UploadLimits bound what each team's uploads hold on the server.
type UploadLimits struct {
	// TeamBytes is the most bytes one team's uploads, stored and under
	// way, may add up to [DefaultUploadTeamMB MiB].
	TeamBytes int64
	// TTL is how long an upload is kept after it was last uploaded, asked
	// for or used by a build [DefaultUploadTTL]; SweepUploads removes it
	// then.
	TTL time.Duration
}

// SetUploadLimits sets the upload quota and expiry; call before serving.
func (s *Store) SetUploadLimits(l UploadLimits) {
	s.uploads.mu.Lock()
	defer s.uploads.mu.Unlock()
	s.uploads.limits = l
}

// uploadLedger is the one place the upload quota is counted: the bytes of
// each team's upload directory, stored and being received, read from the
// disk on a team's first upload and kept since.
type uploadLedger struct {
	mu     sync.Mutex
	limits UploadLimits
	used   map[string]int64 // by upload dir
}

func (l *uploadLedger) teamBytes() int64 {
	if l.limits.TeamBytes > 0 {
		return l.limits.TeamBytes
	}
	return DefaultUploadTeamMB << 20
}

func (l *uploadLedger) ttl() time.Duration {
	if l.limits.TTL > 0 {
		return l.limits.TTL
	}
	return DefaultUploadTTL
}

// loadLocked reads dir's usage from the disk the first time; l.mu held.
func (l *uploadLedger) loadLocked(dir string) int64 {
	if n, ok := l.used[dir]; ok {
		return n
	}
	if l.used == nil {
		l.used = map[string]int64{}
	}
	var n int64
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		// Stored uploads only: parts left by an earlier process are not
		// being received and go at the next sweep.
		if info, err := e.Info(); err == nil && info.Mode().IsRegular() && strings.HasSuffix(e.Name(), ".tar") {
			n += info.Size()
		}
	}
	l.used[dir] = n
	return n
}

// refusal is the quota's error: what was refused, the limit, and how to
// raise it or make room.
func (l *uploadLedger) refusal(used, adding int64) error {
	limit := l.teamBytes()
	return fmt.Errorf("upload quota: the team's uploads hold %d MiB and this upload would bring them past %d MiB, the most this server keeps for a team (agentbox serve --upload-team-max-size); uploads no build uses are removed after %s (--upload-ttl): %w",
		used>>20, limit>>20, l.ttl(), errdefs.ErrResourceExhausted)
}

// room refuses size more bytes in dir when they would pass the quota.
func (l *uploadLedger) room(dir string, size int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	used := l.loadLocked(dir)
	if used+size > l.teamBytes() || used >= l.teamBytes() {
		return l.refusal(used, size)
	}
	return nil
}

// take counts n more bytes in dir, refusing them past the quota.
func (l *uploadLedger) take(dir string, n int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	used := l.loadLocked(dir)
	if used+n > l.teamBytes() || (n == 0 && used >= l.teamBytes()) {
		return l.refusal(used, n)
	}
	l.used[dir] = used + n
	return nil
}

// give takes n bytes of dir off the count (removed, or never kept).
func (l *uploadLedger) give(dir string, n int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.used[dir]; ok {
		l.used[dir] = max(0, l.used[dir]-n)
	}
}

// quotaWriter counts what an upload writes against its team's quota.
type quotaWriter struct {
	ledger *uploadLedger
	dir    string
	n      int64 // counted so far
}

func (w *quotaWriter) Write(p []byte) (int, error) {
	if err := w.ledger.take(w.dir, int64(len(p))); err != nil {
		return 0, err
	}
	w.n += int64(len(p))
	return len(p), nil
}

// SweepUploads removes the uploads no one has uploaded, asked for or built
// from for UploadLimits.TTL, and unfinished upload parts as old, and
// returns how many it removed. The server runs it periodically.
func (s *Store) SweepUploads(now time.Time) (int, error) {
	s.uploads.mu.Lock()
	ttl := s.uploads.ttl()
	s.uploads.mu.Unlock()
	root := filepath.Join(s.dir, uploadsDir)
	teams, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("sweep uploads: %w", err)
	}
	removed := 0
	for _, t := range teams {
		dir := filepath.Join(root, t.Name())
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range entries {
			name := e.Name()
			info, err := e.Info()
			if err != nil || now.Sub(info.ModTime()) < ttl {
				continue
			}
			switch {
			case strings.HasSuffix(name, ".json"):
				hash := strings.TrimSuffix(name, ".json")
				// The record goes first: from then on the upload is
				// absent, and a build that still holds the tar open
				// reads it to the end.
				if os.Remove(filepath.Join(dir, name)) != nil {
					continue
				}
				tar := filepath.Join(dir, hash+".tar")
				if st, err := os.Stat(tar); err == nil && os.Remove(tar) == nil {
					s.uploads.give(dir, st.Size())
				}
				removed++
			case strings.HasPrefix(name, ".part-"):
				// Counted while its upload runs; an upload that is still
				// receiving after a whole TTL fails at its rename.
				_ = os.Remove(filepath.Join(dir, name))
			case strings.HasSuffix(name, ".tar"):
				// A tar without its record (a crash between the two).
				if _, err := os.Stat(filepath.Join(dir, strings.TrimSuffix(name, ".tar")+".json")); errors.Is(err, fs.ErrNotExist) {
					if os.Remove(filepath.Join(dir, name)) == nil {
						s.uploads.give(dir, info.Size())
					}
				}
			}
		}
	}
	if removed > 0 {
		s.log.Info("expired uploads removed", "count", removed, "ttl", ttl)
	}
	return removed, nil
}
