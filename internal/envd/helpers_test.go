package envd

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"connectrpc.com/connect"

	"github.com/agentbox/agentbox/api/gen/filesystem/filesystemconnect"
	"github.com/agentbox/agentbox/api/gen/process/processconnect"
	"github.com/agentbox/agentbox/internal/testutil"
)

const (
	testUID   = 12345
	testToken = "test-token-123"
)

// testEnv is an envd Server on an httptest server with a fake account
// database: root, "tester" (uid 12345, home in a temp dir) and nobody.
type testEnv struct {
	t    *testing.T
	srv  *Server
	url  string
	home string
	// rootHome is root's home in the test's user database: root-only
	// (0700) like a host's /root, but the test's own, so no test depends
	// on the state of the host's /root.
	rootHome string
	root     string // scratch dir, world-traversable
}

func newTestEnv(t *testing.T, token string) *testEnv {
	t.Helper()
	testutil.RequireRoot(t)
	root := t.TempDir()
	// Let the unprivileged test user traverse into its home.
	for d := root; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		_ = os.Chmod(d, 0o755)
	}
	home := filepath.Join(root, "home", "tester")
	if err := os.MkdirAll(home, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(home, testUID, testUID); err != nil {
		t.Fatal(err)
	}
	rootHome := filepath.Join(root, "roothome")
	if err := os.Mkdir(rootHome, 0o700); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(rootHome, ".bashrc"), "# root's\n")
	passwd := filepath.Join(root, "passwd")
	group := filepath.Join(root, "group")
	writeFile(t, passwd, fmt.Sprintf("root:x:0:0:root:%s:/bin/bash\ntester:x:%d:%d::%s:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n", rootHome, testUID, testUID, home))
	writeFile(t, group, fmt.Sprintf("root:x:0:\ntester:x:%d:\nextra:x:23456:tester\nnogroup:x:65534:\n", testUID))
	srv := NewServer(Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), PasswdFile: passwd, GroupFile: group, StartLogDir: filepath.Join(root, "log"), LocalInit: true, Reaper: testReaper})
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() { ts.Close(); srv.Close() })
	e := &testEnv{t: t, srv: srv, url: ts.URL, home: home, rootHome: rootHome, root: root}
	body := map[string]any{"envVars": map[string]string{"SANDBOX_VAR": "sv"}, "defaultUser": "tester", "defaultWorkdir": home}
	if token != "" {
		body["accessToken"] = token
	}
	resp := e.do("POST", "/init", jsonBody(body), nil)
	if resp.StatusCode != http.StatusNoContent || resp.Header.Get("X-Envd-Version") != Version {
		t.Fatalf("init: %d %q", resp.StatusCode, resp.Header.Get("X-Envd-Version"))
	}
	return e
}

func writeFile(t *testing.T, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func jsonBody(v any) io.Reader {
	b, _ := json.Marshal(v)
	return bytes.NewReader(b)
}

// do sends a plain HTTP request; hdr may be nil.
func (e *testEnv) do(method, path string, body io.Reader, hdr map[string]string) *http.Response {
	e.t.Helper()
	req, err := http.NewRequest(method, e.url+path, body)
	if err != nil {
		e.t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// headerTransport adds fixed headers to every request.
type headerTransport struct{ hdr map[string]string }

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range h.hdr {
		r.Header.Set(k, v)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// clientHeaders returns the headers of a call as user (empty: default) with token.
func clientHeaders(user, token string) map[string]string {
	h := map[string]string{}
	if user != "" {
		h["Authorization"] = "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"))
	}
	if token != "" {
		h["X-Access-Token"] = token
	}
	return h
}

// codecs are the two Connect codecs clients may use.
var codecs = []struct {
	name string
	opts []connect.ClientOption
}{
	{"json", []connect.ClientOption{connect.WithProtoJSON()}},
	{"binary", nil},
}

func (e *testEnv) processClient(hdr map[string]string, opts ...connect.ClientOption) processconnect.ProcessClient {
	return processconnect.NewProcessClient(&http.Client{Transport: headerTransport{hdr}}, e.url, opts...)
}

func (e *testEnv) fsClient(hdr map[string]string, opts ...connect.ClientOption) filesystemconnect.FilesystemClient {
	return filesystemconnect.NewFilesystemClient(&http.Client{Transport: headerTransport{hdr}}, e.url, opts...)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return ctx
}
