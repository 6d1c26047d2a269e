package containment

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// server is the agentbox server the attacks run against: one this test
// builds and starts on its own instance, bridge and subnet, or an already
// running one named by CONTAINMENT_API_URL, _API_KEY, _DATA_DIR, _INSTANCE.
type server struct {
	url      string
	key      string
	dataDir  string
	instance string
	stop     func()
}

const defaultTemplateDir = "/var/cache/agentbox/templates"

func startServer(t *testing.T) *server {
	t.Helper()
	if u := os.Getenv("CONTAINMENT_API_URL"); u != "" {
		return &server{url: u, key: os.Getenv("CONTAINMENT_API_KEY"), dataDir: os.Getenv("CONTAINMENT_DATA_DIR"),
			instance: os.Getenv("CONTAINMENT_INSTANCE"), stop: func() {}}
	}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Dir(filepath.Dir(wd)) // tests run in e2e/containment
	// Own binaries: other test packages build and run bin/ concurrently.
	bin := t.TempDir()
	for _, b := range []struct {
		out, pkg string
		env      []string
	}{
		{"agentbox", "./cmd/agentbox", nil},
		{"envd", "./cmd/envd", []string{"CGO_ENABLED=0"}},
	} {
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", filepath.Join(bin, b.out), b.pkg)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), b.env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", b.pkg, err, out)
		}
	}
	tdir := os.Getenv("AGENTBOX_TEMPLATE_DIR")
	if tdir == "" {
		tdir = defaultTemplateDir
	}
	data := t.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	logPath := filepath.Join(data, "serve.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	const instance = "agentbox-ct"
	cmd := exec.Command(filepath.Join(bin, "agentbox"), "serve", "--data-dir", data, "--listen", addr,
		"--template-dir", tdir, "--envd", filepath.Join(bin, "envd"), "--instance", instance,
		"--bridge", "abct0", "--subnet", "10.231.0.0/16", "--health-interval", "5s")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &server{url: "http://" + addr, dataDir: data, instance: instance}
	s.stop = func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(time.Minute):
			_ = cmd.Process.Kill()
		}
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			if len(b) > 20000 {
				b = b[len(b)-20000:]
			}
			t.Logf("--- serve log ---\n%s", b)
		}
	}
	deadline := time.Now().Add(15 * time.Minute)
	for time.Now().Before(deadline) {
		time.Sleep(300 * time.Millisecond)
		key, err := os.ReadFile(filepath.Join(data, "apikey"))
		if err != nil {
			continue
		}
		s.key = strings.TrimSpace(string(key))
		if resp, err := http.Get(s.url + "/health"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return s
			}
		}
	}
	s.stop()
	t.Fatal("server did not become healthy")
	return nil
}

// api calls the control plane and decodes a JSON answer into out.
func (s *server) api(ctx context.Context, method, path string, body, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.url+path, rd)
	if err != nil {
		return 0, err
	}
	req.Header.Set("X-API-Key", s.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		return resp.StatusCode, fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, data)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return resp.StatusCode, err
		}
	}
	return resp.StatusCode, nil
}
