package benchmark

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestImageBytes(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	for p, n := range map[string]int{"pages-1.img": 4096, "sub/inventory.img": 10, "empty": 0} {
		if err := os.WriteFile(filepath.Join(dir, p), make([]byte, n), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("pages-1.img", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	got, err := imageBytes(dir)
	if err != nil || got != 4106 {
		t.Fatalf("imageBytes = %d, %v; want 4106 (regular files only)", got, err)
	}
	if _, err := imageBytes(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("imageBytes of a missing dir: no error")
	}
}

func TestIncrementalRows(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name     string
		written  []int64
		pause    []time.Duration
		tracking bool
		want     []string // substrings of the output; none when nil
	}{
		{name: "one pause prints nothing", written: []int64{1 << 20}, pause: []time.Duration{100 * ms}},
		{name: "full dumps say why", written: []int64{10 << 20, 10 << 20, 10 << 20}, pause: []time.Duration{200 * ms, 100 * ms, 300 * ms},
			want: []string{"full dumps: kernel", "10.0 MiB\t10.0 MiB\t1.00x", "later pauses' time", "100ms\t200ms\t0.5x"}},
		{name: "incremental halves", written: []int64{8 << 20, 4 << 20, 4 << 20}, pause: []time.Duration{200 * ms, 100 * ms, 100 * ms}, tracking: true,
			want: []string{"incremental dumps available", "4.0 MiB\t8.0 MiB\t0.50x"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			incrementalRows(&b, 10, tc.written, tc.pause, tc.tracking, "kernel has no soft-dirty bits")
			if tc.want == nil && b.Len() != 0 {
				t.Fatalf("printed %q, want nothing", b.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("output %q lacks %q", b.String(), w)
				}
			}
		})
	}
}

func TestCRIUMessage(t *testing.T) {
	for in, want := range map[string]string{
		"Warn  (criu/cr-check.c:824): Dirty tracking is OFF. Memory snapshot will not work.": "Dirty tracking is OFF. Memory snapshot will not work.",
		"Looks good.":         "Looks good.",
		"exit (code 1): oops": "exit (code 1): oops",
	} {
		if got := criuMessage(in); got != want {
			t.Errorf("criuMessage(%q) = %q, want %q", in, got, want)
		}
	}
}
