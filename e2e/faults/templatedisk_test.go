package faults

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
	"github.com/agentbox/agentbox/e2e/wire"
	"github.com/agentbox/agentbox/internal/diskspace"
)

// TestFullTemplateDisk puts the template store on a filesystem of its own
// (a tmpfs holding a copy of the base template) and fills it to under the
// reserve: starting a template build and uploading its files are refused
// with 507 naming the template disk and what to free, the build stays
// waiting (its status and the template list say nothing half-built), no
// build leaves a work dir, running sandboxes keep running; once space is
// freed, the same build starts and its template runs a sandbox.
func TestFullTemplateDisk(t *testing.T) {
	const reserveMB = 64
	harness.RequireRoot(t)
	if testing.Short() {
		t.Skip("end-to-end tests skipped in -short mode")
	}
	tplDir := templateDisk(t, 1024)
	s := harness.Start(t, harness.Name("faults-tpldisk"), harness.TemplateDisk(tplDir),
		harness.Args("--build-base=false", "--disk-reserve-mb", fmt.Sprint(reserveMB)))
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	c := wire.New(s.URL, s.APIKey)
	sb := create(ctx, t, s, "container")

	tb := newBuild(ctx, t, s, "full-tpl-disk")
	filler := fill(t, s.TemplateDir, reserveMB)

	steps := map[string]any{"fromTemplate": "base", "steps": []map[string]any{{"type": "RUN", "args": []string{"echo built > /built.txt", "root"}}}}
	for _, op := range []struct {
		name string
		do   func() (int, []byte)
	}{
		{"build start", func() (int, []byte) { return tb.start(steps) }},
		{"upload", func() (int, []byte) { return tb.upload(strings.Repeat("ab", 32), []byte("files of a COPY step")) }},
		{"create", func() (int, []byte) {
			st, b, _ := s.Do(ctx, s.APIKey, http.MethodPost, "/sandboxes", map[string]any{"templateID": "base", "timeout": 60})
			return st, b
		}},
	} {
		st, b := op.do()
		if st != http.StatusInsufficientStorage || !strings.Contains(string(b), "template disk") || !strings.Contains(string(b), "templates no longer used") {
			t.Errorf("%s on a full template disk: %d %s, want 507 naming the template disk and what to free", op.name, st, b)
		} else {
			t.Logf("%s: %s", op.name, b)
		}
	}

	// Nothing half-made: the build waits to be started, no template of its
	// name is listed, no build work dir is left.
	if status, reason := tb.status(); status != "waiting" {
		t.Errorf("the refused build is %q (%s), want waiting: it may be started again", status, reason)
	}
	if st, b, err := s.Do(ctx, s.APIKey, http.MethodGet, "/templates", nil); err != nil || st != http.StatusOK || strings.Contains(string(b), tb.templateID) {
		t.Errorf("template list on a full disk: %d %v, want 200 without the refused build's template: %s", st, err, b)
	}
	if left := buildWorkDirs(t, s.TemplateDir); len(left) > 0 {
		t.Errorf("build work dirs left on a full template disk: %v", left)
	}

	// What runs keeps running.
	if r, err := c.Run(ctx, sb, "", "echo still here > /tmp/x && cat /tmp/x"); err != nil || !strings.Contains(r.Stdout, "still here") {
		t.Fatalf("a running sandbox on a full template disk: %+v %v", r, err)
	}

	// Space freed: the same build starts and its template runs.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if st, b := tb.start(steps); st != http.StatusAccepted {
		t.Fatalf("start the build once space is freed: %d %s", st, b)
	}
	for {
		status, reason := tb.status()
		if status == "ready" {
			break
		}
		if status == "error" || ctx.Err() != nil {
			t.Fatalf("the build after space was freed: %s %s\n%s", status, reason, s.LogTail(40))
		}
		time.Sleep(500 * time.Millisecond)
	}
	st, b, err := s.Do(ctx, s.APIKey, http.MethodPost, "/sandboxes", map[string]any{"templateID": tb.templateID, "timeout": 120})
	if err != nil || st != http.StatusCreated {
		t.Fatalf("a sandbox of the template built after space was freed: %d %s %v", st, b, err)
	}
	var built wire.Sandbox
	if err := json.Unmarshal(b, &built); err != nil {
		t.Fatal(err)
	}
	if r, err := c.Run(ctx, &built, "", "cat /built.txt"); err != nil || !strings.Contains(r.Stdout, "built") {
		t.Errorf("the built template's file: %+v %v", r, err)
	}
	for _, id := range []string{built.SandboxID, sb.SandboxID} {
		if err := c.Kill(ctx, id); err != nil {
			t.Errorf("kill %s: %v", id, err)
		}
	}
	if _, err := os.Stat(filepath.Join(s.TemplateDir, diskspace.ReserveFile)); err != nil {
		t.Errorf("the template disk's reserve file is not held again once there is room: %v", err)
	}
}

// templateDisk mounts a tmpfs of mb MiB as a template store of its own
// and copies the shared cache's base template into it (a hard link cannot
// cross filesystems). It is unmounted after the server's teardown.
func templateDisk(t *testing.T, mb int) string {
	t.Helper()
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, fmt.Sprintf("size=%dm,mode=0711", mb)); err != nil {
		t.Fatalf("mount a %d MiB tmpfs on %s: %v", mb, dir, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount the template disk %s: %v", dir, err)
		}
	})
	src := cmpOr(os.Getenv("AGENTBOX_TEMPLATE_DIR"), harness.DefaultTemplateDir)
	entries, _ := os.ReadDir(src)
	for _, ent := range entries {
		b, err := os.ReadFile(filepath.Join(src, ent.Name(), "template.json"))
		var meta struct {
			Aliases []string
			Layers  []string
		}
		if err != nil || json.Unmarshal(b, &meta) != nil || !slices.Contains(meta.Aliases, "base") || len(meta.Layers) > 0 {
			continue
		}
		if out, err := exec.Command("cp", "-a", filepath.Join(src, ent.Name()), dir).CombinedOutput(); err != nil {
			t.Fatalf("copy the base template: %v %s", err, out)
		}
		return dir
	}
	t.Fatalf("no base template in %s (start any e2e server once to build it)", src)
	return ""
}

// fill fills dir's filesystem to half of reserveMB free: under the
// reserve, yet with room for the server's own records. It returns the
// filler's path.
func fill(t *testing.T, dir string, reserveMB int) string {
	t.Helper()
	free, err := diskspace.Free(dir)
	if err != nil {
		t.Fatal(err)
	}
	return fillTo(t, dir, free-uint64(reserveMB)/2<<20)
}

// buildWorkDirs lists the template store's build work dirs.
func buildWorkDirs(t *testing.T, dir string) []string {
	t.Helper()
	left, err := filepath.Glob(filepath.Join(dir, ".build-*"))
	if err != nil {
		t.Fatal(err)
	}
	return left
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// tplBuild is one build through the E2B build API.
type tplBuild struct {
	ctx                 context.Context
	t                   *testing.T
	s                   *harness.Server
	templateID, buildID string
}

func newBuild(ctx context.Context, t *testing.T, s *harness.Server, name string) *tplBuild {
	t.Helper()
	st, b, err := s.Do(ctx, s.APIKey, http.MethodPost, "/v3/templates", map[string]any{"name": name})
	if err != nil || st != http.StatusAccepted {
		t.Fatalf("request build %s: %d %s %v", name, st, b, err)
	}
	var r struct{ TemplateID, BuildID string }
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	return &tplBuild{ctx: ctx, t: t, s: s, templateID: r.TemplateID, buildID: r.BuildID}
}

func (tb *tplBuild) start(body map[string]any) (int, []byte) {
	st, b, err := tb.s.Do(tb.ctx, tb.s.APIKey, http.MethodPost, "/v2/templates/"+tb.templateID+"/builds/"+tb.buildID, body)
	if err != nil {
		tb.t.Fatalf("start build: %v", err)
	}
	return st, b
}

// upload asks for an upload link for hash and PUTs body to it; it returns
// the first answer that is not a link.
func (tb *tplBuild) upload(hash string, body []byte) (int, []byte) {
	st, b, err := tb.s.Do(tb.ctx, tb.s.APIKey, http.MethodGet, "/templates/"+tb.templateID+"/files/"+hash, nil)
	if err != nil {
		tb.t.Fatalf("upload link: %v", err)
	}
	var link struct{ URL string }
	if st != http.StatusCreated || json.Unmarshal(b, &link) != nil || link.URL == "" {
		return st, b
	}
	req, err := http.NewRequestWithContext(tb.ctx, http.MethodPut, link.URL, bytes.NewReader(body))
	if err != nil {
		tb.t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.t.Fatalf("upload: %v", err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

// status returns the build's status and, when it failed, why.
func (tb *tplBuild) status() (string, string) {
	st, b, err := tb.s.Do(tb.ctx, tb.s.APIKey, http.MethodGet, "/templates/"+tb.templateID+"/builds/"+tb.buildID+"/status", nil)
	if err != nil || st != http.StatusOK {
		tb.t.Fatalf("build status: %d %s %v", st, b, err)
	}
	var r struct {
		Status string
		Reason *struct{ Message string }
	}
	if err := json.Unmarshal(b, &r); err != nil {
		tb.t.Fatalf("build status: %v: %s", err, b)
	}
	if r.Reason != nil {
		return r.Status, r.Reason.Message
	}
	return r.Status, ""
}
