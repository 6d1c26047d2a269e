// Package objstore keeps suspended sandbox images in an S3-compatible
// bucket, encrypted and authenticated: a reader of the bucket learns
// nothing of the tenant memory inside, and a writer cannot make an agent
// restore bytes it did not write for that very object, team and sandbox.
package objstore

import (
	"bufio"
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// ErrIntegrity marks stored bytes that fail authentication: tampered,
// truncated, reordered, swapped from another object, or sealed with
// another key.
var ErrIntegrity = errors.New("image integrity check failed")

// KeySize is the size of the object store key (AES-256).
const KeySize = 32

// ChunkSize is the plaintext size of every chunk but the last.
const ChunkSize = 1 << 20

// magic starts every sealed object (format version 1).
var magic = []byte("agentbox-sealed-v1\n")

const saltSize = 32

// Binding is what a sealed object is bound to: each chunk authenticates
// these, so the bytes only open as this object of this team's sandbox.
type Binding struct {
	Object  string // the object's name in the bucket
	Team    string // the owning tenant (the Kubernetes namespace bound to a team)
	Sandbox string // the Sandbox the image belongs to (its uid)
}

func (b Binding) aad(index uint64, final bool) []byte {
	var buf bytes.Buffer
	buf.Write(magic)
	for _, f := range []string{b.Object, b.Team, b.Sandbox} {
		_ = binary.Write(&buf, binary.BigEndian, uint32(len(f)))
		buf.WriteString(f)
	}
	_ = binary.Write(&buf, binary.BigEndian, index)
	if final {
		buf.WriteByte(1)
	} else {
		buf.WriteByte(0)
	}
	return buf.Bytes()
}

// LoadKey reads the key file: 32 raw bytes or 64 hex digits. It must be a
// regular file readable by its owner only, as it opens every stored image.
func LoadKey(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--kube-object-store-key-file: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("--kube-object-store-key-file: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("--kube-object-store-key-file %s: not a regular file", path)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("--kube-object-store-key-file %s: mode %04o lets other users read the key; chmod 0600 it", path, st.Mode().Perm())
	}
	raw, err := io.ReadAll(io.LimitReader(f, 256))
	if err != nil {
		return nil, fmt.Errorf("--kube-object-store-key-file: %w", err)
	}
	if len(raw) == KeySize {
		return raw, nil
	}
	s := strings.TrimSpace(string(raw))
	if k, err := hex.DecodeString(s); err == nil && len(k) == KeySize {
		return k, nil
	}
	return nil, fmt.Errorf("--kube-object-store-key-file %s: want %d random bytes or %d hex digits (e.g. `openssl rand -hex 32`), got %d bytes", path, KeySize, 2*KeySize, len(raw))
}

func objectAEAD(key, salt []byte) (cipher.AEAD, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("object store key: want %d bytes, got %d", KeySize, len(key))
	}
	// A key per object (from its random salt): chunk counters never repeat
	// a nonce under one key.
	k, err := hkdf.Key(sha256.New, key, salt, "agentbox object store v1", KeySize)
	if err != nil {
		return nil, err
	}
	blk, err := aes.NewCipher(k)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(blk)
}

func nonce(index uint64) []byte {
	n := make([]byte, 12)
	binary.BigEndian.PutUint64(n[4:], index)
	return n
}

// Writer seals a stream: a header (magic, salt), then chunks of
// [flag byte][uint32 length][AES-256-GCM ciphertext]; the last chunk is
// flagged final, so a cut at a chunk boundary is detected.
type Writer struct {
	w     io.Writer
	aead  cipher.AEAD
	b     Binding
	buf   []byte
	index uint64
	err   error
}

// NewWriter starts sealing to w under key for b. Close writes the final
// chunk; without it the object does not open.
func NewWriter(w io.Writer, key []byte, b Binding) (*Writer, error) {
	salt := make([]byte, saltSize)
	if _, err := rand.Read(salt); err != nil {
		return nil, err
	}
	aead, err := objectAEAD(key, salt)
	if err != nil {
		return nil, err
	}
	if _, err := w.Write(append(append([]byte{}, magic...), salt...)); err != nil {
		return nil, err
	}
	return &Writer{w: w, aead: aead, b: b, buf: make([]byte, 0, ChunkSize)}, nil
}

func (s *Writer) Write(p []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	n := 0
	for len(p) > 0 {
		k := min(len(p), ChunkSize-len(s.buf))
		s.buf = append(s.buf, p[:k]...)
		p, n = p[k:], n+k
		if len(s.buf) == ChunkSize {
			if s.err = s.flush(false); s.err != nil {
				return n, s.err
			}
		}
	}
	return n, nil
}

func (s *Writer) flush(final bool) error {
	ct := s.aead.Seal(nil, nonce(s.index), s.buf, s.b.aad(s.index, final))
	hdr := make([]byte, 5)
	if final {
		hdr[0] = 1
	}
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(ct)))
	if _, err := s.w.Write(hdr); err != nil {
		return err
	}
	if _, err := s.w.Write(ct); err != nil {
		return err
	}
	s.index++
	s.buf = s.buf[:0]
	return nil
}

// Close seals the final chunk (possibly empty).
func (s *Writer) Close() error {
	if s.err != nil {
		return s.err
	}
	s.err = s.flush(true)
	if s.err == nil {
		s.err = errors.New("objstore: writer closed")
		return nil
	}
	return s.err
}

// Reader opens a sealed stream, returning only authenticated bytes: each
// chunk is checked before any of it is returned, and the end of the stream
// is an error unless the final chunk was seen. Every failure wraps
// ErrIntegrity.
type Reader struct {
	r     *bufio.Reader
	key   []byte
	b     Binding
	aead  cipher.AEAD
	index uint64
	out   []byte
	done  bool
	err   error
}

// NewReader opens the sealed stream r for b under key.
func NewReader(r io.Reader, key []byte, b Binding) *Reader {
	return &Reader{r: bufio.NewReaderSize(r, 64<<10), key: key, b: b}
}

func (s *Reader) fail(format string, args ...any) error {
	s.err = fmt.Errorf("object %s: %s: %w", s.b.Object, fmt.Sprintf(format, args...), ErrIntegrity)
	return s.err
}

func (s *Reader) Read(p []byte) (int, error) {
	for len(s.out) == 0 {
		if s.err != nil {
			return 0, s.err
		}
		if s.done {
			// Anything after the final chunk is not ours.
			if _, err := s.r.ReadByte(); err != io.EOF {
				return 0, s.fail("bytes after the final chunk")
			}
			return 0, io.EOF
		}
		if err := s.next(); err != nil {
			return 0, err
		}
	}
	n := copy(p, s.out)
	s.out = s.out[n:]
	return n, nil
}

func (s *Reader) next() error {
	if s.aead == nil {
		hdr := make([]byte, len(magic)+saltSize)
		if _, err := io.ReadFull(s.r, hdr); err != nil {
			return s.fail("truncated header")
		}
		if !bytes.Equal(hdr[:len(magic)], magic) {
			return s.fail("not a sealed agentbox object")
		}
		aead, err := objectAEAD(s.key, hdr[len(magic):])
		if err != nil {
			s.err = err
			return err
		}
		s.aead = aead
	}
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(s.r, hdr); err != nil {
		return s.fail("truncated after chunk %d (no final chunk)", s.index)
	}
	final := hdr[0] == 1
	n := binary.BigEndian.Uint32(hdr[1:])
	if hdr[0] > 1 || n < uint32(s.aead.Overhead()) || n > ChunkSize+uint32(s.aead.Overhead()) {
		return s.fail("chunk %d: bad frame", s.index)
	}
	ct := make([]byte, n)
	if _, err := io.ReadFull(s.r, ct); err != nil {
		return s.fail("chunk %d truncated", s.index)
	}
	pt, err := s.aead.Open(ct[:0], nonce(s.index), ct, s.b.aad(s.index, final))
	if err != nil {
		return s.fail("chunk %d does not authenticate (tampered, reordered, from another object, team or sandbox, or another key)", s.index)
	}
	s.index++
	s.out, s.done = pt, final
	return nil
}
