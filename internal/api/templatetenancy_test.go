package api

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/template"
)

// writeRunner stands in for the sandbox manager: each "write <path> <text>"
// command becomes a file in the step's layer.
type writeRunner struct{ mu sync.Mutex }

func (w *writeRunner) RunSteps(_ context.Context, req template.StepRequest) error {
	if err := os.Mkdir(req.UpperDir, 0o755); err != nil {
		return err
	}
	for _, c := range req.Commands {
		p, text, _ := strings.Cut(strings.TrimPrefix(c.Cmd, "write "), " ")
		full := filepath.Join(req.UpperDir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(full, []byte(text), 0o644); err != nil {
			return err
		}
	}
	return nil
}

type tenant struct {
	t   *testing.T
	h   http.Handler
	key string
}

func (c tenant) do(method, path string, body any) (int, string) {
	c.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	default:
		raw, _ := json.Marshal(b)
		rd = bytes.NewReader(raw)
	}
	r := httptest.NewRequest(method, path, rd)
	if c.key != "" {
		r.Header.Set("X-API-Key", c.key)
	}
	r.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	c.h.ServeHTTP(w, r)
	return w.Code, w.Body.String()
}

// TestTemplateAPITenancy attacks team a's templates, builds and uploads
// with team b's key through every template route; each must answer as if
// the object did not exist (or refuse with a reason), and team a's
// template must be intact afterwards.
func TestTemplateAPITenancy(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	teamA, _ := st.EnsureTeam(ctx, "a")
	teamB, _ := st.EnsureTeam(ctx, "b")
	keyA, _, _ := st.CreateAPIKey(ctx, teamA.ID, "")
	keyB, _, _ := st.CreateAPIKey(ctx, teamB.ID, "")
	tpl, err := template.NewStore(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := New(slog.New(slog.DiscardHandler), st, nil, tpl)
	builds, err := template.NewBuilds(ctx, tpl, &writeRunner{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv.SetBuilds(builds)
	h := srv.Handler()
	a, b := tenant{t, h, keyA}, tenant{t, h, keyB}

	// Team a builds "app:v1" with a COPY from an upload and a RUN.
	var req struct{ TemplateID, BuildID string }
	code, body := a.do("POST", "/v3/templates", map[string]any{"name": "app:v1"})
	if code != 202 || json.Unmarshal([]byte(body), &req) != nil {
		t.Fatalf("request build: %d %s", code, body)
	}
	var ctxTar bytes.Buffer
	tw := tar.NewWriter(&ctxTar)
	tw.WriteHeader(&tar.Header{Name: "secret.txt", Mode: 0o644, Size: 8, Typeflag: tar.TypeReg})
	tw.Write([]byte("a-secret"))
	tw.Close()
	hash := strings.Repeat("a1", 32) // E2B-style: a name the server cannot recompute
	var link struct {
		Present bool
		URL     string
	}
	code, body = a.do("GET", "/templates/"+req.TemplateID+"/files/"+hash, nil)
	if code != 201 || json.Unmarshal([]byte(body), &link) != nil || link.Present {
		t.Fatalf("upload link: %d %s", code, body)
	}
	u := strings.TrimPrefix(link.URL, "http://example.com")
	if code, body := (tenant{t, h, ""}).do("PUT", u, ctxTar.Bytes()); code != 200 {
		t.Fatalf("upload: %d %s", code, body)
	}
	// (COPY layers need root for their overlay mount; template's own tests
	// cover them.)
	start := map[string]any{"fromTemplate": "scratch", "steps": []map[string]any{
		{"type": "RUN", "args": []string{"write /made-by-a yes", "root"}},
	}}
	buildPath := "/templates/" + req.TemplateID + "/builds/" + req.BuildID
	if code, body := a.do("POST", "/v2"+buildPath, start); code != 202 {
		t.Fatalf("start: %d %s", code, body)
	}
	for deadline := time.Now().Add(20 * time.Second); ; {
		_, body := a.do("GET", buildPath+"/status", nil)
		if strings.Contains(body, `"status":"ready"`) {
			break
		}
		if strings.Contains(body, `"status":"error"`) || time.Now().After(deadline) {
			t.Fatalf("team a's build: %s", body)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// Team b's attacks.
	var bReq struct{ TemplateID, BuildID string }
	_, body = b.do("POST", "/v3/templates", map[string]any{"name": "app:v1"})
	json.Unmarshal([]byte(body), &bReq)
	for _, tc := range []struct {
		name, method, path string
		body               any
		code               int
		want               string
	}{
		{"GET a's template by ID", "GET", "/templates/" + req.TemplateID, nil, 404, ""},
		{"resolve a's alias", "GET", "/templates/aliases/app", nil, 404, ""},
		{"list a's tags", "GET", "/templates/" + req.TemplateID + "/tags", nil, 404, ""},
		{"tag a's template", "POST", "/templates/tags", map[string]any{"target": req.TemplateID, "tags": []string{"pwned"}}, 404, ""},
		{"untag a's name", "DELETE", "/templates/tags", map[string]any{"name": "app", "tags": []string{"v1"}}, 404, ""},
		{"delete a's template", "DELETE", "/templates/" + req.TemplateID, nil, 404, ""},
		{"a's build status", "GET", buildPath + "/status", nil, 404, ""},
		{"a's build logs", "GET", buildPath + "/logs", nil, 404, ""},
		{"start a's build", "POST", "/v2" + buildPath, start, 404, ""},
		{"upload link on a's template", "GET", "/templates/" + req.TemplateID + "/files/" + hash, nil, 404, ""},
		{"build named base", "POST", "/v3/templates", map[string]any{"name": "base"}, 400, "reserved"},
		{"store-wide gc", "POST", "/templates/gc", nil, 404, "agentbox template gc"},
		{"store-wide usage", "GET", "/templates/usage", nil, 404, "agentbox template usage"},
		{"own build gets another ID", "GET", "/templates/" + bReq.TemplateID, nil, 404, ""},
	} {
		code, body := b.do(tc.method, tc.path, tc.body)
		if code != tc.code || !strings.Contains(body, tc.want) {
			t.Errorf("team b: %s: %s %s = %d %s, want %d %s", tc.name, tc.method, tc.path, code, body, tc.code, tc.want)
		}
	}
	if bReq.TemplateID == "" || bReq.TemplateID == req.TemplateID {
		t.Errorf("team b's build of app:v1 got template ID %q, team a's is %q", bReq.TemplateID, req.TemplateID)
	}
	// Probing a's files hash on b's own build: not present for b, and b's
	// build cannot use it without uploading.
	code, body = b.do("GET", "/templates/"+bReq.TemplateID+"/files/"+hash, nil)
	if code != 201 || !strings.Contains(body, `"present":false`) {
		t.Errorf("team b probes team a's upload: %d %s", code, body)
	}
	code, body = b.do("POST", "/v2/templates/"+bReq.TemplateID+"/builds/"+bReq.BuildID, map[string]any{"fromTemplate": "scratch",
		"steps": []map[string]any{{"type": "COPY", "args": []string{"secret.txt", "/"}, "filesHash": hash}}})
	if code != 400 || !strings.Contains(body, "not uploaded") {
		t.Errorf("team b builds from team a's upload: %d %s", code, body)
	}
	// b's list has none of a's; a's template is intact.
	if _, body := b.do("GET", "/templates", nil); strings.Contains(body, req.TemplateID) {
		t.Errorf("team b lists team a's template: %s", body)
	}
	if code, body := a.do("GET", "/templates/app:v1", nil); code != 200 || !strings.Contains(body, req.TemplateID) || !strings.Contains(body, `"public":false`) {
		t.Errorf("team a's template after the attacks: %d %s", code, body)
	}
	// An upload whose link asked for verification must hash to its name.
	verified := tenant{t, h, keyA}
	var vlink struct{ URL string }
	bad := strings.Repeat("b2", 32)
	_, body = verified.do("GET", "/templates/"+req.TemplateID+"/files/"+bad+"?verify=sha256", nil)
	json.Unmarshal([]byte(body), &vlink)
	code, body = (tenant{t, h, ""}).do("PUT", strings.TrimPrefix(vlink.URL, "http://example.com"), ctxTar.Bytes())
	sum := sha256.Sum256(ctxTar.Bytes())
	if code != 400 || !strings.Contains(body, bad) || !strings.Contains(body, hex.EncodeToString(sum[:])) {
		t.Errorf("mismatched upload: %d %s", code, body)
	}
}
