package envd

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// cutReader yields its data and then fails, as a request body does when the
// client (or a proxy in front) goes away mid-upload.
type cutReader struct{ r io.Reader }

func (c *cutReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if errors.Is(err, io.EOF) {
		return n, io.ErrUnexpectedEOF
	}
	return n, err
}

// TestCutUploadLeavesNoPartialFile checks that an upload whose body ends
// early is reported as failed and leaves no half-written file under its
// name: a new file is removed, an existing one is left empty.
func TestCutUploadLeavesNoPartialFile(t *testing.T) {
	e := newTestEnv(t, "")
	tests := []struct {
		name     string
		existing string // content before the upload; "" for none
		cut      bool
		want     string // content after; "-" for absent
		code     int
	}{
		{name: "cut upload of a new file leaves none", cut: true, want: "-", code: http.StatusBadRequest},
		{name: "cut upload over a file leaves it empty", existing: "old content", cut: true, want: "", code: http.StatusBadRequest},
		{name: "whole upload of a new file", want: "half and the rest", code: http.StatusOK},
		{name: "whole upload over a file", existing: "old content", want: "half and the rest", code: http.StatusOK},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(e.home, "up"+string(rune('a'+i)))
			if tc.existing != "" {
				writeFile(t, path, tc.existing)
				chown(t, path)
			}
			var body io.Reader = strings.NewReader("half and the rest")
			if tc.cut {
				body = &cutReader{strings.NewReader("half")}
			}
			req := httptest.NewRequest(http.MethodPost, "/files?path="+path, body)
			req.Header.Set("Content-Type", "application/octet-stream")
			rec := httptest.NewRecorder()
			e.srv.Handler().ServeHTTP(rec, req)
			if rec.Code != tc.code {
				t.Fatalf("status %d (%s), want %d", rec.Code, rec.Body, tc.code)
			}
			got, err := os.ReadFile(path)
			switch {
			case tc.want == "-" && !errors.Is(err, os.ErrNotExist):
				t.Fatalf("after a cut upload %s holds %q (err %v), want no file", path, got, err)
			case tc.want != "-" && (err != nil || string(got) != tc.want):
				t.Fatalf("%s holds %q (err %v), want %q", path, got, err, tc.want)
			}
		})
	}
}

// TestDiscardPartialKeepsAnotherFile checks that a name taken over by
// another file while the upload ran is not removed.
func TestDiscardPartialKeepsAnotherFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "target")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := os.Rename(path, path+".moved"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("someone else's"), 0o644); err != nil {
		t.Fatal(err)
	}
	discardPartial(path, f, true)
	if got, err := os.ReadFile(path); err != nil || string(got) != "someone else's" {
		t.Fatalf("%s = %q, %v; want the other file kept", path, got, err)
	}
}
