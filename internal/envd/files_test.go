package envd

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestSignatureVector(t *testing.T) {
	// Static vector from E2B's SDK tests.
	got := Signature("hello.txt", "read", "user", "0tQG31xiMp0IOQfaz9dcwi72L1CPo8e0", 0)
	if want := "v1_gUtH/s9YCJWgCizjfUxuWfhFE4QSydOWEIIvfLwDr6E"; got != want {
		t.Fatalf("signature %s, want %s", got, want)
	}
}

// multipartBody builds a multipart body with one "file" part per name.
func multipartBody(t *testing.T, files map[string]string) (io.Reader, string) {
	t.Helper()
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	for name, content := range files {
		w, err := mw.CreateFormFile("file", name)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(w, content)
	}
	mw.Close()
	return &b, mw.FormDataContentType()
}

func decodeUploads(t *testing.T, resp *http.Response) []uploadedFile {
	t.Helper()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("upload: %d %s", resp.StatusCode, body)
	}
	var out []uploadedFile
	if err := json.Unmarshal(body, &out); err != nil {
		t.Fatalf("upload response %s: %v", body, err)
	}
	return out
}

func readBack(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestUploadDownload(t *testing.T) {
	e := newTestEnv(t, testToken)
	auth := clientHeaders("", testToken)

	t.Run("multipart with path query", func(t *testing.T) {
		body, ct := multipartBody(t, map[string]string{"ignored-name": "hello"})
		out := decodeUploads(t, e.do("POST", "/files?path=x.txt", body, merge(auth, "Content-Type", ct)))
		p := filepath.Join(e.home, "x.txt")
		if len(out) != 1 || out[0].Path != p || out[0].Name != "x.txt" || out[0].Type != "file" || readBack(t, p) != "hello" {
			t.Fatalf("out %v", out)
		}
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil || st.Uid != testUID {
			t.Fatalf("owner %d %v", st.Uid, err)
		}
	})
	t.Run("multipart filenames as paths", func(t *testing.T) {
		abs := filepath.Join(e.root, "abs", "c.txt")
		if err := os.MkdirAll(filepath.Dir(abs), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Dir(abs), 0o777); err != nil {
			t.Fatal(err)
		}
		body, ct := multipartBody(t, map[string]string{"a/b.txt": "AB", abs: "C"})
		out := decodeUploads(t, e.do("POST", "/files", body, merge(auth, "Content-Type", ct)))
		if len(out) != 2 || readBack(t, filepath.Join(e.home, "a", "b.txt")) != "AB" || readBack(t, abs) != "C" {
			t.Fatalf("out %v", out)
		}
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(e.home, "a"), &st); err != nil || st.Uid != testUID {
			t.Fatalf("parent owner %d %v", st.Uid, err)
		}
	})
	t.Run("octet-stream gzip overwrite", func(t *testing.T) {
		var gz bytes.Buffer
		zw := gzip.NewWriter(&gz)
		zw.Write([]byte("zipped"))
		zw.Close()
		decodeUploads(t, e.do("POST", "/files?path=x.txt", &gz, merge(auth, "Content-Type", "application/octet-stream", "Content-Encoding", "gzip")))
		if got := readBack(t, filepath.Join(e.home, "x.txt")); got != "zipped" {
			t.Fatalf("content %q", got)
		}
	})
	t.Run("metadata xattrs replaced per upload", func(t *testing.T) {
		p := filepath.Join(e.home, "m.txt")
		out := decodeUploads(t, e.do("POST", "/files?path=m.txt", strings.NewReader("m"), merge(auth, "Content-Type", "application/octet-stream", "X-Metadata-Owner", "alice", "X-Metadata-Kind", "doc")))
		if out[0].Metadata["owner"] != "alice" {
			t.Fatalf("response metadata %v", out[0].Metadata)
		}
		if md := readMetadata(p); md["owner"] != "alice" || md["kind"] != "doc" {
			t.Fatalf("xattrs %v", md)
		}
		decodeUploads(t, e.do("POST", "/files?path=m.txt", strings.NewReader("m"), merge(auth, "Content-Type", "application/octet-stream", "X-Metadata-Kind", "img")))
		if md := readMetadata(p); len(md) != 1 || md["kind"] != "img" {
			t.Fatalf("xattrs after replace %v", md)
		}
		resp := e.do("POST", "/files?path=m.txt", strings.NewReader("m"), merge(auth, "Content-Type", "application/octet-stream", "X-Metadata-Bad", "caf\xc3\xa9"))
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("non-ASCII metadata: %d", resp.StatusCode)
		}
	})
	t.Run("download", func(t *testing.T) {
		resp := e.do("GET", "/files?path=x.txt", nil, auth)
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || string(b) != "zipped" {
			t.Fatalf("%d %q", resp.StatusCode, b)
		}
		resp = e.do("GET", "/files?path=x.txt", nil, merge(auth, "Range", "bytes=1-3"))
		b, _ = io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusPartialContent || string(b) != "ipp" {
			t.Fatalf("range: %d %q", resp.StatusCode, b)
		}
		// Go's transport decompresses transparently only when it asked itself.
		req, _ := http.NewRequest("GET", e.url+"/files?path=x.txt", nil)
		req.Header.Set("X-Access-Token", testToken)
		req.Header.Set("Accept-Encoding", "gzip")
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		zr, err := gzip.NewReader(resp.Body)
		if err != nil || resp.Header.Get("Content-Encoding") != "gzip" {
			t.Fatalf("gzip: %v %q", err, resp.Header.Get("Content-Encoding"))
		}
		b, _ = io.ReadAll(zr)
		if string(b) != "zipped" {
			t.Fatalf("gunzip %q", b)
		}
	})
	t.Run("download errors", func(t *testing.T) {
		resp := e.do("GET", "/files?path=nope.txt", nil, auth)
		b, _ := io.ReadAll(resp.Body)
		want := fmt.Sprintf(`{"code":404,"message":"path '%s' does not exist"}`, filepath.Join(e.home, "nope.txt"))
		if resp.StatusCode != 404 || strings.TrimSpace(string(b)) != want {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		if resp := e.do("GET", "/files?path=~", nil, auth); resp.StatusCode != 400 {
			t.Fatalf("directory: %d", resp.StatusCode)
		}
		if resp := e.do("GET", "/files?path=x.txt&username=ghost", nil, auth); resp.StatusCode != 401 {
			t.Fatalf("unknown user: %d", resp.StatusCode)
		}
	})
}

func merge(h map[string]string, kv ...string) map[string]string {
	out := map[string]string{}
	for k, v := range h {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

func TestFilesAuth(t *testing.T) {
	e := newTestEnv(t, testToken)
	writeFile(t, filepath.Join(e.home, "hello.txt"), "hi")
	if err := os.Chown(filepath.Join(e.home, "hello.txt"), testUID, testUID); err != nil {
		t.Fatal(err)
	}
	sig := func(op string, exp int64) string {
		q := url.Values{"path": {"hello.txt"}, "username": {"tester"}, "signature": {Signature("hello.txt", op, "tester", testToken, exp)}}
		if exp != 0 {
			q.Set("signature_expiration", strconv.FormatInt(exp, 10))
		}
		return "/files?" + q.Encode()
	}
	cases := []struct {
		name, method, path string
		hdr                map[string]string
		code               int
		msg                string
	}{
		{"no credentials", "GET", "/files?path=hello.txt", nil, 401, unauthorizedMessage},
		{"wrong token", "GET", "/files?path=hello.txt", map[string]string{"X-Access-Token": "bad"}, 401, unauthorizedMessage},
		{"token", "GET", "/files?path=hello.txt", map[string]string{"X-Access-Token": testToken}, 200, ""},
		{"signature", "GET", sig("read", 0), nil, 200, ""},
		{"signature with expiration", "GET", sig("read", time.Now().Add(time.Hour).Unix()), nil, 200, ""},
		{"expired signature", "GET", sig("read", time.Now().Add(-time.Hour).Unix()), nil, 401, "signature is already expired"},
		{"signature for another op", "GET", sig("write", 0), nil, 401, "invalid signature"},
		{"tampered signature", "GET", strings.Replace(sig("read", 0), "v1_", "v1_x", 1), nil, 401, "invalid signature"},
		{"envs needs token", "GET", "/envs", nil, 401, unauthorizedMessage},
		{"metrics needs token", "GET", "/metrics", nil, 401, unauthorizedMessage},
		{"health is open", "GET", "/health", nil, 204, ""},
	}
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			resp := e.do(tt.method, tt.path, nil, tt.hdr)
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tt.code {
				t.Fatalf("%d %s, want %d", resp.StatusCode, b, tt.code)
			}
			if tt.msg != "" {
				var je struct {
					Code    int    `json:"code"`
					Message string `json:"message"`
				}
				if err := json.Unmarshal(b, &je); err != nil || je.Code != tt.code || je.Message != tt.msg {
					t.Fatalf("body %s, want message %q", b, tt.msg)
				}
			}
		})
	}
	// Signed upload.
	body, ct := multipartBody(t, map[string]string{"f": "up"})
	if resp := e.do("POST", sig("write", 0), body, map[string]string{"Content-Type": ct}); resp.StatusCode != 200 {
		t.Fatalf("signed upload %d", resp.StatusCode)
	}
	// A later /init needs the current token.
	if resp := e.do("POST", "/init", jsonBody(map[string]any{"accessToken": "stolen"}), nil); resp.StatusCode != 401 {
		t.Fatalf("re-init without token: %d", resp.StatusCode)
	}
	if resp := e.do("POST", "/init", jsonBody(map[string]any{"envVars": map[string]string{"A": "b"}}), map[string]string{"X-Access-Token": testToken}); resp.StatusCode != 204 {
		t.Fatalf("re-init with token: %d", resp.StatusCode)
	}
	resp := e.do("GET", "/envs", nil, map[string]string{"X-Access-Token": testToken})
	var envs map[string]string
	if err := json.NewDecoder(resp.Body).Decode(&envs); err != nil || envs["A"] != "b" || len(envs) != 1 {
		t.Fatalf("envs %v %v", envs, err)
	}
}

func TestFilesUserPermissions(t *testing.T) {
	e := newTestEnv(t, "")
	secret := filepath.Join(e.root, "secret")
	if err := os.MkdirAll(secret, 0o700); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(secret, "f"), "secret")
	rootOwned := filepath.Join(e.home, "rootfile")
	writeFile(t, rootOwned, "orig") // 0644 root-owned inside tester's home
	cases := []struct {
		name, method, path string
		code               int
	}{
		{"nobody reads root-only file", "GET", "/files?username=nobody&path=" + secret + "/f", 403},
		{"tester reads root's home", "GET", "/files?path=" + e.rootHome + "/.bashrc", 403},
		{"tester writes /etc", "POST", "/files?path=/etc/envd-test-should-not-exist", 403},
		{"nobody writes into root-only dir", "POST", "/files?username=nobody&path=" + secret + "/g", 403},
		{"traversal to /etc", "POST", "/files?path=../../../../../../../../etc/envd-test-should-not-exist", 403},
		{"overwrite root-owned file", "POST", "/files?path=rootfile", 403},
		{"NUL in path", "GET", "/files?path=a%00b", 400},
	}
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			var body io.Reader
			hdr := map[string]string{}
			if tt.method == "POST" {
				body, hdr["Content-Type"] = strings.NewReader("pwned"), "application/octet-stream"
			}
			resp := e.do(tt.method, tt.path, body, hdr)
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tt.code {
				t.Fatalf("%d %s, want %d", resp.StatusCode, b, tt.code)
			}
		})
	}
	if _, err := os.Stat("/etc/envd-test-should-not-exist"); err == nil {
		os.Remove("/etc/envd-test-should-not-exist")
		t.Fatal("wrote into /etc")
	}
	if readBack(t, rootOwned) != "orig" || readBack(t, filepath.Join(secret, "f")) != "secret" {
		t.Fatal("protected file changed")
	}
}

func TestUploadLargeStreams(t *testing.T) {
	e := newTestEnv(t, "")
	// 64 MiB through multipart; the server must not hold it in memory, which
	// the design guarantees (part by part, io.Copy); here we check integrity.
	const size = 64 << 20
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() {
		w, _ := mw.CreateFormFile("file", "big.bin")
		chunk := bytes.Repeat([]byte("0123456789abcdef"), 4096)
		for n := 0; n < size; n += len(chunk) {
			w.Write(chunk)
		}
		mw.Close()
		pw.Close()
	}()
	decodeUploads(t, e.do("POST", "/files", pr, map[string]string{"Content-Type": mw.FormDataContentType()}))
	fi, err := os.Stat(filepath.Join(e.home, "big.bin"))
	if err != nil || fi.Size() != size {
		t.Fatalf("size %v %v", fi, err)
	}
	// No temporary files are left behind.
	ents, _ := os.ReadDir(e.home)
	for _, de := range ents {
		if strings.HasPrefix(de.Name(), ".envd-upload-") {
			t.Fatalf("leftover %s", de.Name())
		}
	}
}

func TestUploadNoSpace(t *testing.T) {
	e := newTestEnv(t, "")
	mnt := filepath.Join(e.root, "tiny")
	if err := os.MkdirAll(mnt, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=64k,mode=0777"); err != nil {
		t.Skipf("tmpfs: %v", err)
	}
	defer unix.Unmount(mnt, unix.MNT_DETACH)
	resp := e.do("POST", "/files?path="+mnt+"/f", bytes.NewReader(make([]byte, 1<<20)), map[string]string{"Content-Type": "application/octet-stream"})
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusInsufficientStorage {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
}

func TestMetricsAndHealth(t *testing.T) {
	e := newTestEnv(t, "")
	resp := e.do("GET", "/metrics", nil, nil)
	var m Metrics
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		t.Fatal(err)
	}
	if m.Timestamp == 0 || m.CPUCount < 1 || m.MemTotal == 0 || m.MemUsed == 0 || m.DiskTotal == 0 || m.MemTotalMiB != m.MemTotal>>20 {
		t.Fatalf("metrics %+v", m)
	}
	if resp := e.do("GET", "/health", nil, nil); resp.StatusCode != 204 {
		t.Fatalf("health %d", resp.StatusCode)
	}
}
