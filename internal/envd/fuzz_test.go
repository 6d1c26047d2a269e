package envd

import (
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
)

func FuzzResolvePath(f *testing.F) {
	for _, s := range []string{"", "~", "~/x", "x/../../..", "/etc/../root", "a\x00b", "~user", strings.Repeat("a/", 3000)} {
		f.Add(s, "/home/user")
	}
	f.Add("x", "")
	f.Add("x", "relative/home")
	f.Fuzz(func(t *testing.T, p, home string) {
		got, err := ResolvePath(p, home)
		if err != nil {
			return
		}
		if !filepath.IsAbs(got) || filepath.Clean(got) != got {
			t.Fatalf("ResolvePath(%q, %q) = %q: not absolute and clean", p, home, got)
		}
		if strings.IndexByte(got, 0) >= 0 {
			t.Fatalf("NUL survived: %q", got)
		}
	})
}

// FuzzUploadParsing feeds arbitrary bodies and content types to the upload
// parser: it must never panic and never yield an empty target.
func FuzzUploadParsing(f *testing.F) {
	f.Add("multipart/form-data; boundary=X", "--X\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a/b.txt\"\r\n\r\nhello\r\n--X--\r\n", "")
	f.Add("application/octet-stream", "raw", "p.txt")
	f.Add("multipart/form-data", "", "")
	f.Add("text/plain", "x", "x")
	f.Fuzz(func(t *testing.T, ct, body, path string) {
		r, err := http.NewRequest("POST", "http://envd/files", strings.NewReader(body))
		if err != nil {
			return
		}
		q := r.URL.Query()
		q.Set("path", path)
		r.URL.RawQuery = q.Encode()
		r.Header.Set("Content-Type", ct)
		_ = forEachUpload(r, func(target string, body io.Reader) error {
			if target == "" {
				t.Fatal("empty target")
			}
			_, err := io.Copy(io.Discard, body)
			return err
		})
		_, _ = metadataFromHeader(http.Header{"X-Metadata-" + path: {body}})
	})
}
