// Package templates tests template builds end to end: a real `agentbox
// serve`, Template.build() from the official e2b npm SDK, the CLI's
// Dockerfile build, and sandboxes started from the results.
package templates

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
	"github.com/agentbox/agentbox/internal/runtime/bundle"
	"github.com/agentbox/agentbox/internal/template"
)

type env struct {
	root, bin, dataDir, tplDir, addr, key string
}

func (e *env) api(t *testing.T, method, path string, body any, out any) int {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, "http://"+e.addr+path, rd)
	req.Header.Set("X-API-Key", e.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode/100 == 2 {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %v: %s", method, path, err, b)
		}
	}
	if resp.StatusCode/100 != 2 {
		t.Logf("%s %s: %s %s", method, path, resp.Status, b)
	}
	return resp.StatusCode
}

// setup builds the binaries, links the base template into a fresh template
// dir (hard links: no copy) and starts a server on its own instance.
func setup(t *testing.T) *env {
	harness.RequireRoot(t)
	if testing.Short() {
		t.Skip("e2e")
	}
	tplDir := t.TempDir()
	src := cmpOr(os.Getenv("AGENTBOX_TEMPLATE_DIR"), harness.DefaultTemplateDir)
	ensureBase(t, src)
	entries, _ := os.ReadDir(src)
	linked := false
	for _, ent := range entries {
		// The base template itself, not one layered on it (whose
		// definition names "base" too).
		b, err := os.ReadFile(filepath.Join(src, ent.Name(), "template.json"))
		var meta struct{ Aliases []string }
		if err != nil || json.Unmarshal(b, &meta) != nil || !slices.Contains(meta.Aliases, "base") {
			continue
		}
		linkStoreDir(t, filepath.Join(src, ent.Name()), filepath.Join(tplDir, ent.Name()))
		linked = true
		break
	}
	if !linked {
		t.Fatalf("no base template in %s", src)
	}
	s := harness.Start(t, harness.TemplateDir(tplDir), harness.Args("--build-base=false"))
	harness.NPMInstall(t, filepath.Join(s.Root, "e2e", "js")) // the SDK scripts import its e2b
	return &env{root: s.Root, bin: s.Bin, dataDir: s.DataDir, tplDir: tplDir, addr: s.Addr, key: s.APIKey}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

type sdkResult struct {
	ColdMs, CachedMs, CreateMs int
	SameID                     bool
	Info                       struct{ TemplateID string }
	Logs                       []string
	Exists                     bool
	Hello, Ignored, BuiltAs    string
	Pwd, Env, Whoami, Cwd      string
	Served                     string
	BrokenError                string
	BrokenExists               bool
}

func TestE2BTemplateBuild(t *testing.T) {
	e := setup(t)
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("needs node")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "build.mjs")
	cmd.Env = append(os.Environ(), "E2B_API_URL=http://"+e.addr, "E2B_SANDBOX_URL=http://"+e.addr, "E2B_API_KEY="+e.key,
		"E2B_MODULE="+filepath.Join(e.root, "e2e/js/node_modules/e2b/dist/index.mjs"), "TEMPLATE_NAME=sdk-built")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node: %v\n%s\n%s", err, out, stderr.String())
	}
	var r sdkResult
	if err := json.Unmarshal(bytes.TrimSpace(out[bytes.LastIndexByte(bytes.TrimSpace(out), '\n')+1:]), &r); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"rebuild keeps the template ID", r.SameID, true},
		{"Template.exists", r.Exists, true},
		{"COPY", r.Hello, "hello from the context"},
		{".dockerignore", r.Ignored, "0"},
		{"RUN as root with ENV", r.BuiltAs, "hi root"},
		{"WORKDIR for RUN", r.Pwd, "/opt/app"},
		{"template ENV in sandboxes", r.Env, "hi-test"},
		{"USER becomes the default user", r.Whoami, "user"},
		{"WORKDIR becomes the default cwd", r.Cwd, "/opt/app"},
		{"start command ran and create waited for its ready check", r.Served, "hello from the context"},
		{"failed build leaves no template", r.BrokenExists, false},
	}
	for _, c := range checks {
		if fmt.Sprint(c.got) != fmt.Sprint(c.want) {
			t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
		}
	}
	if !strings.Contains(r.BrokenError, "exit code 7") || !strings.Contains(r.BrokenError, "broken-step-output") {
		t.Errorf("failed RUN error %q lacks the exit code and output", r.BrokenError)
	}
	cachedLines := 0
	for _, l := range r.Logs {
		if strings.TrimSpace(l) == "cached" {
			cachedLines++
		}
	}
	if cachedLines < 4 {
		t.Errorf("the rebuild reused %d cached layers, want 4", cachedLines)
	}
	t.Logf("Template.build cold %d ms, cached %d ms; create with start+ready %d ms", r.ColdMs, r.CachedMs, r.CreateMs)

	// Two sandboxes of the template share its layers; each has its own
	// writable layer.
	var a, b struct{ SandboxID string }
	for _, sb := range []*struct{ SandboxID string }{&a, &b} {
		if code := e.api(t, "POST", "/sandboxes", map[string]any{"templateID": "sdk-built:v1"}, sb); code != 201 {
			t.Fatalf("create: %d", code)
		}
	}
	la, ua := overlayOf(t, e.dataDir, a.SandboxID)
	lb, ub := overlayOf(t, e.dataDir, b.SandboxID)
	if la != lb || ua == ub || !strings.Contains(la, "/layers/") {
		t.Errorf("sandboxes do not share their lower layers or share an upper:\n%s %s\n%s %s", la, ua, lb, ub)
	}
	// The same file in both sandboxes is one inode of one layer.
	if ia, ib := statInLayers(t, la, "opt/data/pwd.txt"), statInLayers(t, lb, "opt/data/pwd.txt"); ia != ib || ia == "" {
		t.Errorf("template file is inode %q in one sandbox and %q in the other", ia, ib)
	}
	if err := os.WriteFile(filepath.Join(ua, "only-in-a"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(ub, "only-in-a")); err == nil {
		t.Error("a write of one sandbox shows up in the other's layer")
	}

	// Deleting the template keeps the running sandboxes' layers (GC skips
	// mounted layers); once they are gone GC frees them.
	if code := e.api(t, "DELETE", "/templates/sdk-built", nil, nil); code != 204 {
		t.Fatalf("delete template: %d", code)
	}
	// GC is the operator's command on the store, not a team's API call.
	if code := e.api(t, "POST", "/templates/gc", nil, nil); code != 404 {
		t.Errorf("POST /templates/gc answered %d, want 404 pointing at the CLI", code)
	}
	removedLayers := func() int {
		t.Helper()
		out, err := exec.Command(e.bin, "template", "gc", "--template-dir", e.tplDir).CombinedOutput()
		if err != nil {
			t.Fatalf("template gc: %v\n%s", err, out)
		}
		var n int
		if _, err := fmt.Sscanf(string(out), "removed %d layers", &n); err != nil {
			t.Fatalf("template gc output: %s", out)
		}
		return n
	}
	removedLayers()
	for _, l := range strings.Split(la, ":") {
		if _, err := os.Stat(l); err != nil {
			t.Errorf("gc removed layer %s, which running sandboxes use", l)
		}
	}
	for _, id := range []string{a.SandboxID, b.SandboxID} {
		e.api(t, "DELETE", "/sandboxes/"+id, nil, nil)
	}
	if n := removedLayers(); n < 3 {
		t.Errorf("gc after the sandboxes are gone removed %d layers, want the template's 3", n)
	}
}

// overlayOf returns the lower layers (host paths, colon-joined, top first)
// and the upper dir of sandbox id's rootfs overlay. The mount options name
// the layers by descriptor (no host path shows in the sandbox's
// mountinfo), so the bundle's own list of its layers is read instead.
func overlayOf(t *testing.T, dataDir, id string) (lower, upper string) {
	t.Helper()
	// Host paths are named by the sandbox's host key, not its id.
	state := filepath.Join(dataDir, "sandboxes")
	key, err := bundle.HostKey(state, id)
	if err != nil {
		t.Fatalf("host key of %s: %v", id, err)
	}
	dir := filepath.Join(state, key)
	b, err := os.ReadFile(filepath.Join(dir, "layers"))
	if err != nil {
		t.Fatalf("layers of sandbox %s: %v", id, err)
	}
	lower = strings.Join(strings.Fields(string(b)), ":")
	upper, _ = bundle.LayerDirs(dir, false)
	if on, _ := bundle.LayerDirs(dir, true); isDir(on) {
		upper = on
	}
	mountinfo, _ := os.ReadFile("/proc/self/mountinfo")
	return resolveIdmapped(string(mountinfo), lower), upper
}

func isDir(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}

// resolveIdmapped replaces each lower layer that is an idmapped mount (a
// user-namespaced sandbox's view of a template layer) by the directory it
// shows, read from the mount's root field (the layers live on the root
// filesystem here).
func resolveIdmapped(mountinfo, lowers string) string {
	roots := map[string]string{}
	for line := range strings.Lines(mountinfo) {
		f := strings.Fields(line)
		if len(f) > 5 && strings.Contains(line, "idmapped") {
			roots[f[4]] = f[3]
		}
	}
	parts := strings.Split(lowers, ":")
	for i, l := range parts {
		if root, ok := roots[l]; ok {
			parts[i] = root
		}
	}
	return strings.Join(parts, ":")
}

// statInLayers finds rel in the topmost lower layer that has it and
// returns "dev:inode".
func statInLayers(t *testing.T, lowers, rel string) string {
	for _, l := range strings.Split(lowers, ":") {
		if out, err := exec.Command("stat", "-c", "%d:%i", filepath.Join(l, rel)).Output(); err == nil {
			return strings.TrimSpace(string(out))
		}
	}
	return ""
}

func TestCLIDockerfileBuild(t *testing.T) {
	e := setup(t)
	ctxDir := t.TempDir()
	df := "FROM base\nENV FROM_CLI=yes\nWORKDIR /srv\nCOPY hello.txt .\nRUN cat hello.txt > copy.txt\nUSER user\nEXPOSE 8080\nCMD [\"sleep\", \"infinity\"]\n"
	os.WriteFile(filepath.Join(ctxDir, "Dockerfile"), []byte(df), 0o644)
	os.WriteFile(filepath.Join(ctxDir, "hello.txt"), []byte("from the cli\n"), 0o644)
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(e.bin, args...)
		cmd.Env = append(os.Environ(), "AGENTBOX_API_URL=http://"+e.addr, "E2B_API_URL=http://"+e.addr, "AGENTBOX_API_KEY="+e.key)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("agentbox %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	out := run("template", "build", "--template-dir", e.tplDir, "-t", "cli-app:v1", ctxDir)
	if !strings.Contains(out, "built cli-app:v1") {
		t.Errorf("build output: %s", out)
	}
	out = run("template", "build", "--template-dir", e.tplDir, "-t", "cli-app:v1", ctxDir)
	if strings.Contains(out, "done in") {
		t.Errorf("unchanged rebuild was not cached:\n%s", out)
	}
	if ls := run("template", "ls", "--api-url", "http://"+e.addr); !strings.Contains(ls, "cli-app") {
		t.Errorf("template ls: %s", ls)
	}
	insp := run("template", "inspect", "--api-url", "http://"+e.addr, "cli-app:v1")
	for _, want := range []string{`"startCmd": "sleep infinity"`, `"defaultWorkdir": "/srv"`, `"FROM_CLI": "yes"`, `8080`} {
		if !strings.Contains(insp, want) {
			t.Errorf("inspect lacks %s:\n%s", want, insp)
		}
	}
	var sb struct{ SandboxID string }
	if code := e.api(t, "POST", "/sandboxes", map[string]any{"templateID": "cli-app:v1"}, &sb); code != 201 {
		t.Fatalf("create from the CLI-built template: %d", code)
	}
	e.api(t, "DELETE", "/sandboxes/"+sb.SandboxID, nil, nil)
	run("template", "rm", "--api-url", "http://"+e.addr, "cli-app:v1")
	if code := e.api(t, "GET", "/templates/cli-app", nil, nil); code != 404 {
		t.Errorf("template still there after rm: %d", code)
	}
	if gc := run("template", "gc", "--template-dir", e.tplDir); !strings.Contains(gc, "removed") {
		t.Errorf("gc output: %s", gc)
	}
}

// linkStoreDir hard-links a template or layer dir of a template store:
// its metadata and rootfs only, not the uid-shifted copies (rootfs.uidshift-*)
// a user-namespaced server may be writing or deleting meanwhile.
func linkStoreDir(t *testing.T, from, to string) {
	t.Helper()
	if err := os.MkdirAll(to, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"template.json", "layer.json", "rootfs"} {
		if _, err := os.Lstat(filepath.Join(from, name)); err != nil {
			continue
		}
		if out, err := exec.Command("cp", "-al", filepath.Join(from, name), to).CombinedOutput(); err != nil {
			t.Fatalf("link %s: %v %s", from, err, out)
		}
	}
}

// ensureBase builds the base template in the shared cache dir if it is not
// there yet (first use on this host), as a server's first start would.
func ensureBase(t *testing.T, dir string) {
	t.Helper()
	ctx := context.Background()
	st, err := template.NewStore(dir, slog.Default())
	if err != nil {
		t.Fatalf("template store %s: %v", dir, err)
	}
	if _, err := st.Get(ctx, "", "base"); err == nil {
		return
	}
	t.Logf("building the base template in %s", dir)
	if _, err := st.Build(ctx, template.BuiltinDefinitions()["base"], nil, io.Discard); err != nil {
		t.Fatalf("build base template: %v", err)
	}
}
