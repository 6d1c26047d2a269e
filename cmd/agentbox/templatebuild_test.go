package main

import (
	"bytes"
	"context"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/template"
	"github.com/agentbox/agentbox/internal/testutil"
)

// recordingRunner stands in for the sandbox manager and records the RUN
// steps it is asked for.
type recordingRunner struct {
	mu   sync.Mutex
	cmds []template.StepCommand
}

func (r *recordingRunner) RunSteps(_ context.Context, req template.StepRequest) error {
	r.mu.Lock()
	r.cmds = append(r.cmds, req.Commands...)
	r.mu.Unlock()
	return os.Mkdir(req.UpperDir, 0o755)
}

// TestTemplateBuildThroughServer: `template build -f` sends a Dockerfile
// through the server's build API, so its RUN steps reach the server's step
// runner as the team's, with Docker's user semantics.
func TestTemplateBuildThroughServer(t *testing.T) {
	testutil.RequireRoot(t) // COPY layers mount an overlay
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	team, _ := st.EnsureTeam(ctx, "cli")
	key, _, _ := st.CreateAPIKey(ctx, team.ID, "")
	tpl, err := template.NewStore(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	runner := &recordingRunner{}
	builds, err := template.NewBuilds(ctx, tpl, runner, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := api.New(slog.New(slog.DiscardHandler), st, nil, tpl)
	srv.SetBuilds(builds)
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()

	ctxDir := t.TempDir()
	os.WriteFile(filepath.Join(ctxDir, "hello.txt"), []byte("from the cli\n"), 0o644)
	os.WriteFile(filepath.Join(ctxDir, "Dockerfile"), []byte("FROM scratch\nENV A=1\nWORKDIR /srv\nCOPY hello.txt .\n"+
		"RUN echo as-root\nUSER nobody\nRUN echo as-nobody\nEXPOSE 8080\nCMD [\"sleep\", \"infinity\"]\n"), 0o644)
	run := func() string {
		t.Helper()
		cmd := newRootCmd()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs([]string{"template", "build", "--api-url", hs.URL, "--api-key", key, "-t", "cli-app:v1", ctxDir})
		if err := cmd.ExecuteContext(ctx); err != nil {
			t.Fatalf("template build: %v\n%s", err, out.String())
		}
		return out.String()
	}
	out := run()
	if !strings.Contains(out, "built cli-app:v1") {
		t.Errorf("output: %s", out)
	}
	got, err := tpl.Get(ctx, team.ID, "cli-app:v1")
	if err != nil {
		t.Fatal(err)
	}
	if got.TeamID != team.ID || got.StartCmd != "sleep infinity" || got.DefaultWorkdir != "/srv" || got.Env["A"] != "1" ||
		!slices.Equal(got.ExposedPorts, []int{8080}) || got.DefaultUser != "nobody" {
		t.Errorf("template: %+v", got)
	}
	if b, _, ok := readLayers(got, "srv/hello.txt"); !ok || b != "from the cli\n" {
		t.Errorf("copied file: %q %v", b, ok)
	}
	if len(runner.cmds) != 2 || runner.cmds[0].User != "root" || runner.cmds[1].User != "nobody" || runner.cmds[0].Workdir != "/srv" {
		t.Errorf("RUN steps reached the runner as %+v", runner.cmds)
	}
	// Unchanged: the upload is present and every layer cached.
	if out := run(); strings.Contains(out, "done in") || strings.Contains(out, "uploaded") {
		t.Errorf("unchanged rebuild was not cached:\n%s", out)
	}
}

func readLayers(t *template.Template, rel string) (string, os.FileInfo, bool) {
	for i := len(t.Layers) - 1; i >= 0; i-- {
		p := filepath.Join(t.Layers[i], rel)
		if fi, err := os.Lstat(p); err == nil {
			b, _ := os.ReadFile(p)
			return string(b), fi, true
		}
	}
	return "", nil, false
}
