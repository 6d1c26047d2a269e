package api

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/template"
)

// TestTemplateTagsAndFinishedBuilds runs the tag endpoints and the status
// of a build made before the server (re)started against a real template
// store.
func TestTemplateTagsAndFinishedBuilds(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	team, _ := st.EnsureTeam(ctx, "a")
	key, _, _ := st.CreateAPIKey(ctx, team.ID, "")
	tpl, err := template.NewStore(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	for _, x := range []*template.Template{
		{ID: "tapp1", TeamID: team.ID, Aliases: []string{"app"}, Tags: []string{"default", "v1"}, CreatedAt: now.Add(-time.Minute), BuildID: "11111111-2222-3333-4444-555555555555"},
		{ID: "tapp2", TeamID: team.ID, Aliases: []string{"app"}, Tags: []string{"v2"}, CreatedAt: now},
	} {
		if err := tpl.Register(ctx, x); err != nil {
			t.Fatal(err)
		}
	}
	// A fresh build registry: it never saw these builds.
	srv := New(slog.New(slog.DiscardHandler), st, nil, tpl)
	builds, err := template.NewBuilds(ctx, tpl, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv.SetBuilds(builds)
	h := srv.Handler()
	do := func(method, path, body string) (int, string) {
		t.Helper()
		r := httptest.NewRequest(method, path, strings.NewReader(body))
		r.Header.Set("X-API-Key", key)
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code, w.Body.String()
	}
	for _, tc := range []struct {
		name, method, path, body string
		code                     int
		want                     string
	}{
		{"assign", "POST", "/templates/tags", `{"target":"app:v1","tags":["stable"]}`, 201, `"buildID":"11111111-2222-3333-4444-555555555555"`},
		{"list by name", "GET", "/templates/app/tags", "", 200, `"tag":"stable"`},
		{"resolves", "GET", "/templates/aliases/app", "", 200, `"templateID":"tapp2"`},
		{"move", "POST", "/templates/tags", `{"target":"app:v2","tags":["stable"]}`, 201, `"tags":["stable"]`},
		{"list by id", "GET", "/templates/tapp1/tags", "", 200, `"tag":"v1"`},
		{"delete", "DELETE", "/templates/tags", `{"name":"app","tags":["stable"]}`, 204, ""},
		{"deleted", "GET", "/templates/tapp2/tags", "", 200, `[{"tag":"v2"`},
		{"bad tag", "POST", "/templates/tags", `{"target":"app:v1","tags":["Not OK"]}`, 400, ""},
		{"no target", "POST", "/templates/tags", `{"tags":["x"]}`, 400, ""},
		{"unknown target", "POST", "/templates/tags", `{"target":"nope:v1","tags":["x"]}`, 404, ""},
		{"unknown name", "DELETE", "/templates/tags", `{"name":"nope","tags":["x"]}`, 404, ""},
		{"unknown template", "GET", "/templates/nope/tags", "", 404, ""},
		{"other sub-path", "GET", "/templates/tapp1/other", "", 404, ""},
		{"alias named tags", "GET", "/templates/aliases/tags", "", 404, `template \"tags\"`},
		{"finished build", "GET", "/templates/tapp1/builds/11111111-2222-3333-4444-555555555555/status", "", 200, `"status":"ready"`},
		{"finished build logs", "GET", "/templates/tapp1/builds/11111111-2222-3333-4444-555555555555/logs", "", 200, "was built at"},
		{"other build", "GET", "/templates/tapp1/builds/99999999-2222-3333-4444-555555555555/status", "", 404, ""},
		{"template without build id", "GET", "/templates/tapp2/builds/tapp2/status", "", 404, ""},
	} {
		code, body := do(tc.method, tc.path, tc.body)
		if code != tc.code || !strings.Contains(body, tc.want) {
			t.Errorf("%s: %s %s = %d %s, want %d with %s", tc.name, tc.method, tc.path, code, body, tc.code, tc.want)
		}
	}
	_, body := do("GET", "/templates/app/tags", "")
	var tags []struct{ Tag, BuildID, CreatedAt string }
	if err := json.Unmarshal([]byte(body), &tags); err != nil || len(tags) != 3 {
		t.Errorf("tags of app: %s", body)
	}
	for _, x := range tags {
		if x.BuildID == "" || x.CreatedAt == "" {
			t.Errorf("tag %+v lacks build ID or time", x)
		}
	}
}
