package template

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/untar"
)

func gzipped(t *testing.T, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(b)
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// rawTarHeader is a ustar header block, for entries archive/tar will not
// write (PAX sparse headers) or sizes it would not leave unwritten.
func rawTarHeader(name string, typ byte, size int64) []byte {
	b := make([]byte, 512)
	copy(b, name)
	copy(b[100:], "0000644\x00")
	copy(b[108:], "0000000\x00")
	copy(b[116:], "0000000\x00")
	copy(b[124:], fmt.Sprintf("%011o\x00", size))
	copy(b[136:], "00000000000\x00")
	copy(b[148:], "        ")
	b[156] = typ
	copy(b[257:], "ustar\x0000")
	sum := 0
	for _, c := range b {
		sum += int(c)
	}
	copy(b[148:], fmt.Sprintf("%06o\x00 ", sum))
	return b
}

func paxRecord(k, v string) string {
	n := len(k) + len(v) + 3
	for {
		s := fmt.Sprintf("%d %s=%s\n", n, k, v)
		if len(s) == n {
			return s
		}
		n = len(s)
	}
}

// sparseTar is a tar of one PAX 1.0 sparse file of size bytes that are all
// hole: a few KiB declaring gigabytes.
func sparseTar(size int64) []byte {
	var buf bytes.Buffer
	recs := paxRecord("GNU.sparse.major", "1") + paxRecord("GNU.sparse.minor", "0") +
		paxRecord("GNU.sparse.name", "sparse") + paxRecord("GNU.sparse.realsize", fmt.Sprint(size))
	buf.Write(rawTarHeader("PaxHeaders/sparse", 'x', int64(len(recs))))
	buf.Write(append([]byte(recs), make([]byte, 512-len(recs)%512)...))
	buf.Write(rawTarHeader("sparse", '0', 512))
	m := make([]byte, 512)
	copy(m, "1\n0\n0\n") // one data region of 0 bytes at 0: the rest is hole
	buf.Write(m)
	buf.Write(make([]byte, 1024))
	return buf.Bytes()
}

func duSize(t *testing.T, dir string) int64 {
	var n int64
	filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return nil
	})
	return n
}

func TestUnpackLimits(t *testing.T) {
	ctx := context.Background()
	zeros := func(n int) string { return strings.Repeat("\x00", n) }
	many := make([]tarEntry, 11)
	for i := range many {
		many[i] = tarEntry{name: fmt.Sprintf("f%d", i), body: "x"}
	}
	small := untar.Limits{RatioGrace: 1 << 20}
	for _, tc := range []struct {
		name    string
		archive []byte
		lim     untar.Limits
		want    string // in the refusal
	}{
		{"gzip bomb", gzipped(t, layerTar(t, []tarEntry{{name: "zeros", body: zeros(16 << 20)}})), small, "decompression ratio 100:1 past the first 1 MiB"},
		{"bomb after the tar's end", gzipped(t, append(layerTar(t, []tarEntry{{name: "a", body: "x"}}), zeros(16<<20)...)), small, "ratio 100:1"},
		{"too many files", layerTar(t, many), untar.Limits{MaxEntries: 10}, "limit: 10 files unpacked"},
		{"too many bytes", layerTar(t, []tarEntry{{name: "a", body: zeros(3 << 10)}}), untar.Limits{MaxBytes: 2 << 10}, "declares 3072 bytes"},
		{"file past the per-file limit", layerTar(t, []tarEntry{{name: "a", body: zeros(3 << 10)}}), untar.Limits{MaxEntryBytes: 2 << 10}, "more than the limit of 2 KiB per file"},
		{"huge declared entry", append(rawTarHeader("huge", '0', 0o77777777777), make([]byte, 4096)...), untar.Limits{MaxBytes: 1 << 30}, "declares 8589934591 bytes"},
		{"huge sparse entry", sparseTar(5 << 30), small, "ratio 100:1"},
		{"sparse entry past the byte limit", sparseTar(5 << 30), untar.Limits{MaxBytes: 1 << 30}, "declares 5368709120 bytes"},
		{"path too long", layerTar(t, []tarEntry{{name: strings.Repeat("n", 300), body: "x"}}), untar.Limits{MaxPathBytes: 200}, "limit of 200 bytes per path"},
		{"path too deep", layerTar(t, []tarEntry{{name: strings.Repeat("d/", 20) + "f", body: "x"}}), untar.Limits{MaxPathDepth: 10}, "21 levels deep, more than the limit of 10 levels"},
		{"link target too long", layerTar(t, []tarEntry{{name: "l", typ: tar.TypeSymlink, link: strings.Repeat("t", 300)}}), untar.Limits{MaxPathBytes: 200}, "limit of 200 bytes per path"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			_, err := unpackArchive(ctx, bytes.NewReader(tc.archive), dir, tc.lim)
			if !errors.Is(err, errdefs.ErrTooLarge) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want ErrTooLarge with %q", err, tc.want)
			}
			if testing.Verbose() {
				t.Log(err)
			}
			if n := duSize(t, dir); n > 2<<20 {
				t.Errorf("%d bytes written before the refusal", n)
			}
		})
	}
}

func TestUnpackWithinLimits(t *testing.T) {
	ctx := context.Background()
	plain := layerTar(t, []tarEntry{{name: "d/", typ: tar.TypeDir}, {name: "d/f", body: strings.Repeat("abc", 1000)}})
	sum := sha256.Sum256(plain)
	want := "sha256:" + hex.EncodeToString(sum[:])
	var zbuf bytes.Buffer
	zw, _ := zstd.NewWriter(&zbuf)
	zw.Write(plain)
	zw.Close()
	for name, archive := range map[string][]byte{"plain": plain, "gzip": gzipped(t, plain), "zstd": zbuf.Bytes()} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			st, err := unpackArchive(ctx, bytes.NewReader(archive), dir, untar.Limits{})
			if err != nil {
				t.Fatal(err)
			}
			if st.Digest != want || st.Bytes != 3000 || st.Entries != 2 {
				t.Errorf("stats %+v, want digest %s, 3000 bytes, 2 entries", st, want)
			}
			if b, _ := os.ReadFile(filepath.Join(dir, "d/f")); len(b) != 3000 {
				t.Errorf("d/f has %d bytes", len(b))
			}
		})
	}
	d := DefaultUnpackLimits()
	if d.MaxBytes != 10<<30 || d.MaxEntryBytes != 10<<30 || d.MaxEntries != 1_000_000 || d.MaxRatio != 100 || d.RatioGrace != 64<<20 {
		t.Errorf("defaults %+v", d)
	}
}
