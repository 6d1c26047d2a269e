package template

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// TestUploadQuota: a team's uploads, stored and under way, add up to at
// most its quota; the upload past it is refused with the flag that raises
// it, and leaves nothing behind; another team's quota is its own; a
// declared size is judged before any byte is read; replacing an upload
// does not count it twice.
func TestUploadQuota(t *testing.T) {
	s, err := NewStore(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	s.SetUploadLimits(UploadLimits{TeamBytes: 3 << 20})
	mib := bytes.Repeat([]byte{'x'}, 1<<20)
	hash := func(i int) string { return fmt.Sprintf("%064x", i) }
	put := func(team string, i int, body []byte) error {
		_, err := s.PutUpload(team, hash(i), bytes.NewReader(body), MaxUploadBytes, false)
		return err
	}
	refused := func(err error) bool {
		return errors.Is(err, errdefs.ErrResourceExhausted) && strings.Contains(err.Error(), "--upload-team-max-size")
	}
	for _, tc := range []struct {
		name    string
		team    string
		i       int
		body    []byte
		refused bool
	}{
		{"first MiB", "a", 1, mib, false},
		{"second MiB", "a", 2, mib, false},
		{"the same upload again replaces it", "a", 2, mib, false},
		{"third MiB fills the quota", "a", 3, mib, false},
		{"one byte more is refused", "a", 4, []byte{'y'}, true},
		{"another team has its own quota", "b", 1, mib, false},
	} {
		err := put(tc.team, tc.i, tc.body)
		if tc.refused != refused(err) || (!tc.refused && err != nil) {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if tc.refused && s.HasUpload(tc.team, hash(tc.i)) {
			t.Fatalf("%s: the refused upload was kept", tc.name)
		}
	}
	if err := s.CheckUploadRoom("b", 2<<20); err != nil {
		t.Fatalf("team b's declared 2 MiB with 2 MiB left: %v", err)
	}
	if err := s.CheckUploadRoom("b", 2<<20+1); !refused(err) {
		t.Fatalf("team b's declared size past its quota: %v", err)
	}
	// Refused mid-stream: what was read is given back.
	err = put("b", 9, bytes.Repeat([]byte{'z'}, 3<<20))
	if !refused(err) {
		t.Fatalf("an upload passing the quota as it streams: %v", err)
	}
	if err := put("b", 10, bytes.Repeat([]byte{'z'}, 2<<20)); err != nil {
		t.Fatalf("the room a refused upload used was not given back: %v", err)
	}
	parts, _ := filepath.Glob(filepath.Join(s.uploadDir("b"), ".part-*"))
	if len(parts) != 0 {
		t.Fatalf("refused uploads left parts: %v", parts)
	}
}

// TestSweepUploads: an upload no one used for the TTL is removed and its
// room given back; one asked for (HasUpload) or built from within the TTL
// stays; a restarted server counts what is on the disk.
func TestSweepUploads(t *testing.T) {
	dir := t.TempDir()
	s, err := NewStore(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.SetUploadLimits(UploadLimits{TeamBytes: 2 << 20, TTL: time.Hour})
	mib := bytes.Repeat([]byte{'x'}, 1<<20)
	old, kept := strings.Repeat("a", 64), strings.Repeat("b", 64)
	for _, h := range []string{old, kept} {
		if _, err := s.PutUpload("t", h, bytes.NewReader(mib), MaxUploadBytes, false); err != nil {
			t.Fatal(err)
		}
	}
	// Both were made two hours ago; kept was asked for since.
	past := time.Now().Add(-2 * time.Hour)
	for _, h := range []string{old, kept} {
		for _, ext := range []string{".json", ".tar"} {
			if err := os.Chtimes(filepath.Join(s.uploadDir("t"), h+ext), past, past); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !s.HasUpload("t", kept) {
		t.Fatal("kept is missing")
	}
	// A fresh server on the same dir knows the quota is full.
	s2, _ := NewStore(dir, nil)
	s2.SetUploadLimits(UploadLimits{TeamBytes: 2 << 20, TTL: time.Hour})
	if err := s2.CheckUploadRoom("t", 1); err == nil {
		t.Fatal("a restarted server forgot the stored uploads")
	}
	n, err := s2.SweepUploads(time.Now())
	if err != nil || n != 1 {
		t.Fatalf("sweep: %d removed, %v; want 1", n, err)
	}
	if s2.HasUpload("t", old) {
		t.Error("the expired upload is still there")
	}
	if !s2.HasUpload("t", kept) {
		t.Error("the upload asked for within the TTL was removed")
	}
	if _, err := s2.PutUpload("t", strings.Repeat("c", 64), io.LimitReader(bytes.NewReader(mib), 1<<20), MaxUploadBytes, false); err != nil {
		t.Fatalf("the expired upload's room was not given back: %v", err)
	}
}
