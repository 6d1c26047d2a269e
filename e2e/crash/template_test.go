package crash

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
	"github.com/agentbox/agentbox/internal/template"
)

// TestCrashTemplateSteps crashes the server after every step of a template
// upload and a template build (template.CrashSteps) and checks what the
// restarted server holds: an upload is stored and listed or gone without
// a part file; a build is ready and its template starts a sandbox, or is
// failed with the restart reason (or still waiting to be started), and no
// layer temp dir or build sandbox is left.
func TestCrashTemplateSteps(t *testing.T) {
	s := harness.Start(t)
	only := strings.TrimSpace(testFilterStep())
	for i, p := range template.CrashSteps() {
		point := p[0] + "/" + p[1]
		if only != "" && !strings.Contains(point, only) {
			continue
		}
		t.Run(point, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
			defer cancel()
			s.Terminate(t)
			s.Launch(t, "--test-crash-after", point)
			before := s.HostState(ctx)
			tmpBefore := storeTemps(s.TemplateDir)
			name := fmt.Sprintf("crash-tpl-%d-%d", i, time.Now().UnixNano()%1e6)
			// A crash right after the request is reached by the request
			// itself: the client never learns the build's ID.
			requested := p == [2]string{template.OpBuild, template.StepBuildRequested}
			tb := &tplBuild{s: s, ctx: ctx}
			if !requested {
				tb = requestBuild(ctx, t, s, name)
			}
			body := tinyTar(t, name)
			sum := sha256.Sum256(body)
			hash := hex.EncodeToString(sum[:])
			go func() {
				if requested {
					_, _, _ = s.Do(ctx, s.APIKey, http.MethodPost, "/v3/templates", map[string]any{"name": name})
					return
				}
				if p[0] == template.OpUpload {
					_, _ = tb.upload(hash, body)
					return
				}
				_, _, _ = s.Do(ctx, s.APIKey, http.MethodPost, "/v2/templates/"+tb.templateID+"/builds/"+tb.buildID,
					map[string]any{"fromTemplate": "base", "steps": []map[string]any{{"type": "RUN", "args": []string{"echo crash-row", "root"}}}})
			}()
			select {
			case <-s.Exited():
			case <-time.After(4 * time.Minute):
				t.Fatalf("the server did not crash at %s", point)
			}
			if ps := s.ProcessState(); ps == nil || !killed(ps.Sys()) {
				t.Fatalf("the server exited with %v, want SIGKILL at %s", ps, point)
			}
			s.Launch(t)
			if p[0] == template.OpUpload {
				checkUpload(t, s, tb, hash)
			} else if !requested {
				checkBuild(ctx, t, s, tb)
			}
			if left := newEntries(tmpBefore, storeTemps(s.TemplateDir)); len(left) > 0 {
				t.Errorf("temporary files left in the template store after the restart: %v", left)
			}
			s.WaitNoLeaks(t, before)
		})
	}
}

type tplBuild struct {
	s                   *harness.Server
	ctx                 context.Context
	templateID, buildID string
}

func requestBuild(ctx context.Context, t *testing.T, s *harness.Server, name string) *tplBuild {
	t.Helper()
	st, b, err := s.Do(ctx, s.APIKey, http.MethodPost, "/v3/templates", map[string]any{"name": name})
	if err != nil || st != http.StatusAccepted {
		t.Fatalf("request build %s: %d %s %v", name, st, b, err)
	}
	var r struct{ TemplateID, BuildID string }
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	return &tplBuild{s: s, ctx: ctx, templateID: r.TemplateID, buildID: r.BuildID}
}

// link returns whether hash is stored and, if not, where to PUT it.
func (tb *tplBuild) link(hash string) (bool, string, error) {
	st, b, err := tb.s.Do(tb.ctx, tb.s.APIKey, http.MethodGet, "/templates/"+tb.templateID+"/files/"+hash, nil)
	if err != nil {
		return false, "", err
	}
	if st != http.StatusCreated {
		return false, "", fmt.Errorf("upload link: %d %s", st, b)
	}
	var l struct {
		Present bool
		URL     string
	}
	if err := json.Unmarshal(b, &l); err != nil {
		return false, "", err
	}
	return l.Present, l.URL, nil
}

func (tb *tplBuild) upload(hash string, body []byte) (int, error) {
	present, url, err := tb.link(hash)
	if err != nil || present {
		return 0, err
	}
	req, err := http.NewRequestWithContext(tb.ctx, http.MethodPut, url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

func tinyTar(t *testing.T, name string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	data := []byte(name)
	if err := tw.WriteHeader(&tar.Header{Name: "hello.txt", Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	_, _ = tw.Write(data)
	_ = tw.Close()
	return buf.Bytes()
}

// checkUpload: the upload counts (the link says present and its tar and
// record are on disk) or is gone with no tar of its hash left.
func checkUpload(t *testing.T, s *harness.Server, tb *tplBuild, hash string) {
	t.Helper()
	present, _, err := tb.link(hash)
	if err != nil {
		t.Fatalf("upload link after the restart: %v", err)
	}
	tars, _ := filepath.Glob(filepath.Join(s.TemplateDir, ".uploads", "*", hash+".tar"))
	recs, _ := filepath.Glob(filepath.Join(s.TemplateDir, ".uploads", "*", hash+".json"))
	switch {
	case present && (len(tars) != 1 || len(recs) != 1):
		t.Errorf("upload %s reported present, but its files are %v %v", hash[:12], tars, recs)
	case !present && len(tars)+len(recs) > 0:
		t.Errorf("upload %s reported absent, but its files are left: %v %v", hash[:12], tars, recs)
	}
}

// checkBuild: a ready build's template starts a sandbox; an interrupted
// one is failed with the restart reason; a build only requested is still
// waiting to be started.
func checkBuild(ctx context.Context, t *testing.T, s *harness.Server, tb *tplBuild) {
	t.Helper()
	_, b, err := s.Do(ctx, s.APIKey, http.MethodGet, "/templates/"+tb.templateID+"/builds/"+tb.buildID+"/status", nil)
	if err != nil {
		t.Fatalf("build status after the restart: %v", err)
	}
	var st struct {
		Status string
		Reason *struct{ Message string }
	}
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatalf("build status: %v: %s", err, b)
	}
	t.Logf("build %s after the restart: %s", tb.buildID, b)
	switch st.Status {
	case "ready":
		code, body, err := s.Do(ctx, s.APIKey, http.MethodPost, "/sandboxes", map[string]any{"templateID": tb.templateID, "timeout": 300})
		if err != nil || code != http.StatusCreated {
			t.Fatalf("a sandbox from the ready template %s: %d %s %v", tb.templateID, code, body, err)
		}
		var sb struct{ SandboxID string }
		_ = json.Unmarshal(body, &sb)
		if code, body, err := s.Do(ctx, s.APIKey, http.MethodDelete, "/sandboxes/"+sb.SandboxID, nil); err != nil || code >= 300 {
			t.Errorf("kill %s: %d %s %v", sb.SandboxID, code, body, err)
		}
	case "error":
		if st.Reason == nil || st.Reason.Message != template.RestartedReason {
			t.Errorf("interrupted build failed with %s, want %q", b, template.RestartedReason)
		}
	case "waiting":
	default:
		t.Errorf("build is %q after the restart: %s", st.Status, b)
	}
}

// storeTemps lists the template store's temporary entries: layer temp
// dirs and upload parts and record temps.
func storeTemps(dir string) map[string]bool {
	out := map[string]bool{}
	for _, pat := range []string{"layers/.tmp-*", ".uploads/*/.part-*", ".uploads/*/*.json.tmp"} {
		m, _ := filepath.Glob(filepath.Join(dir, pat))
		for _, p := range m {
			out[p] = true
		}
	}
	return out
}

func newEntries(before, after map[string]bool) []string {
	var out []string
	for p := range after {
		if !before[p] {
			if _, err := os.Stat(p); err == nil {
				out = append(out, p)
			}
		}
	}
	return out
}
