package template

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"strconv"
	"strings"

	"github.com/klauspost/compress/zstd"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/untar"
)

// DefaultUnpackLimits are the limits of image layers (Store.SetUnpackLimits
// fills their zero fields from them): 10 GiB of files, holes of sparse
// files counted (they are written), 1,000,000 entries, a decompression
// ratio of 100:1 past the first 64 MiB, paths of 4096 bytes and 256 levels.
func DefaultUnpackLimits() untar.Limits {
	return untar.Limits{MaxBytes: 10 << 30, MaxEntryBytes: 10 << 30, MaxEntries: 1_000_000, MaxRatio: 100, RatioGrace: 64 << 20, MaxPathBytes: 4096, MaxPathDepth: 256}
}

func tooLarge(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, errdefs.ErrTooLarge)...)
}

// sizeName writes n bytes for a message: "10 GiB", "64 MiB", "3072 bytes".
func sizeName(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}

// shortName quotes an entry name for a message, cut to 64 bytes.
func shortName(p string) string {
	if len(p) > 64 {
		return strconv.Quote(p[:64]) + "…"
	}
	return strconv.Quote(p)
}

// checkPath refuses an entry name or link target past the path limits.
func checkPath(l untar.Limits, what, p string) error {
	if len(p) > l.MaxPathBytes {
		return tooLarge("%s %s: %d bytes long, more than the limit of %d bytes per path", what, shortName(p), len(p), l.MaxPathBytes)
	}
	if d := strings.Count(p, "/") + 1; d > l.MaxPathDepth {
		return tooLarge("%s %s: %d levels deep, more than the limit of %d levels per path", what, shortName(p), d, l.MaxPathDepth)
	}
	return nil
}

// checkRatio refuses unpacked bytes out of proportion to the archive bytes
// received so far.
func checkRatio(l untar.Limits, unpacked, archive int64) error {
	if unpacked > l.RatioGrace && unpacked/l.MaxRatio > archive {
		return tooLarge("the archive unpacks to more than %d times its size (%d bytes from %d received; limit: decompression ratio %d:1 past the first %s)",
			l.MaxRatio, unpacked, archive, l.MaxRatio, sizeName(l.RatioGrace))
	}
	return nil
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// archiveStream is an archive's tar stream: decompressed if it was gzip or
// zstd, hashed (the diff ID of a layer), and held to the ratio limit
// against the bytes of the archive received.
type archiveStream struct {
	in     *countingReader // the archive as received
	r      io.Reader       // the tar stream
	h      hash.Hash
	n      int64 // tar stream bytes
	lim    untar.Limits
	closer func()
}

func newArchiveStream(r io.Reader, lim untar.Limits) (*archiveStream, error) {
	s := &archiveStream{in: &countingReader{r: r}, h: sha256.New(), lim: lim, closer: func() {}}
	br := bufio.NewReader(s.in)
	magic, _ := br.Peek(4)
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("gzip: %w", err)
		}
		zr.Multistream(true)
		s.r, s.closer = zr, func() { zr.Close() }
	case bytes.Equal(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(256<<20))
		if err != nil {
			return nil, fmt.Errorf("zstd: %w", err)
		}
		s.r, s.closer = zr, zr.Close
	default:
		s.r = br
	}
	return s, nil
}

func (s *archiveStream) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	s.n += int64(n)
	s.h.Write(p[:n])
	if lerr := checkRatio(s.lim, s.n, s.in.n); lerr != nil {
		return n, lerr
	}
	return n, err
}

// digest is "sha256:<hex>" of the tar stream read so far.
func (s *archiveStream) digest() string { return "sha256:" + hex.EncodeToString(s.h.Sum(nil)) }

// unpackArchive unpacks the archive r (a tar, gzipped or zstd-compressed
// or not, as received) into dir with unpackLimited, reads the stream to its
// end and returns the digest of the tar stream in the stats.
func unpackArchive(ctx context.Context, r io.Reader, dir string, lim untar.Limits) (unpackStats, error) {
	return unpackArchiveTo(ctx, r, dir, lim, false)
}

func unpackArchiveTo(ctx context.Context, r io.Reader, dir string, lim untar.Limits, deferOpaque bool) (unpackStats, error) {
	lim = lim.Or(DefaultUnpackLimits())
	s, err := newArchiveStream(r, lim)
	if err != nil {
		return unpackStats{}, err
	}
	defer s.closer()
	st, err := unpackLimited(ctx, s, dir, lim, func() int64 { return s.in.n }, deferOpaque)
	if err != nil {
		return st, err
	}
	// The rest (tar padding) belongs to the digest.
	if _, err := io.Copy(io.Discard, s); err != nil {
		return st, fmt.Errorf("read archive: %w", err)
	}
	st.Digest = s.digest()
	return st, nil
}

// limitedWriter counts file content against the byte and ratio limits
// before writing it.
type limitedWriter struct {
	w       io.Writer
	name    string
	written *int64
	archive func() int64
	lim     untar.Limits
}

func (w *limitedWriter) Write(p []byte) (int, error) {
	*w.written += int64(len(p))
	if *w.written > w.lim.MaxBytes {
		return 0, tooLarge("%s: the files unpack to more than the limit of %s", shortName(w.name), sizeName(w.lim.MaxBytes))
	}
	if w.archive != nil {
		if err := checkRatio(w.lim, *w.written, w.archive()); err != nil {
			return 0, fmt.Errorf("%s: %w", shortName(w.name), err)
		}
	}
	return w.w.Write(p)
}
