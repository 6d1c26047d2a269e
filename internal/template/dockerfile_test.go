package template

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/testutil"
)

// busyboxArchive writes a docker-save tarball of a busybox image and
// returns its source string.
func busyboxArchive(t testing.TB) string {
	t.Helper()
	img := imageOf(t, [][]byte{busyboxLayer(t)}, v1.Config{Env: []string{"PATH=/bin"}})
	p := filepath.Join(t.TempDir(), "busybox.tar")
	tag, _ := name.NewTag("busybox:test")
	if err := tarball.WriteToFile(p, tag, img); err != nil {
		t.Fatal(err)
	}
	return SourceDockerArchive + p
}

func writeFiles(t testing.TB, dir string, files map[string]string) {
	t.Helper()
	for p, body := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

const fullDockerfile = `# every supported instruction
ARG BASE
FROM ${BASE}
ARG GREETING=hello
ENV APP_HOME=/app LANG=C.UTF-8
WORKDIR $APP_HOME
COPY src/ ./src/
COPY --chown=app:app --chmod=0600 secret.txt /etc/secret.txt
ADD notes.txt .
RUN fake-write greeting.txt {env:GREETING} from {user} in {wd} with {env:LANG}
USER app
RUN fake-write /home/app/uid.txt {user}
EXPOSE 8080 9090/tcp
LABEL purpose=test
HEALTHCHECK CMD test -f /tmp/ready
ENTRYPOINT ["/bin/sh", "-c"]
CMD ["echo serving"]
`

func buildDockerfile(t *testing.T, s *Store, runner StepRunner, ctxDir, dockerfile string, args map[string]string) (*Template, string, error) {
	t.Helper()
	spec, err := ParseDockerfile(strings.NewReader(dockerfile), ctxDir, args)
	if err != nil {
		return nil, "", err
	}
	spec.Name, spec.Tag, spec.TeamID, spec.LocalImages = "app", "v1", "team-a", true
	spec.Runner = runner
	var log bytes.Buffer
	tpl, err := s.BuildFromSpec(context.Background(), *spec, &log)
	return tpl, log.String(), err
}

func TestDockerfileBuild(t *testing.T) {
	testutil.RequireRoot(t)
	s := newTestStore(t)
	ctxDir := t.TempDir()
	writeFiles(t, ctxDir, map[string]string{
		"src/a.txt": "a", "src/sub/b.txt": "b", "src/ignored.txt": "no", "debug.log": "no",
		"secret.txt": "s3cret", "notes.txt": "notes", ".dockerignore": "src/ignored.txt\n*.log\n",
	})
	args := map[string]string{"BASE": busyboxArchive(t)}
	runner := &fakeRunner{}
	tpl, log, err := buildDockerfile(t, s, runner, ctxDir, fullDockerfile, args)
	if err != nil {
		t.Fatalf("%v\n%s", err, log)
	}
	files := map[string]string{
		"app/greeting.txt": "hello from root in /app with C.UTF-8\n",
		"app/src/a.txt":    "a", "app/src/sub/b.txt": "b", "app/notes.txt": "notes",
		"home/app/uid.txt": "app\n",
	}
	for p, want := range files {
		if got, _, ok := readInTemplate(t, tpl, p); !ok || got != want {
			t.Errorf("%s = %q (present %v), want %q", p, got, ok, want)
		}
	}
	if _, _, ok := readInTemplate(t, tpl, "app/src/ignored.txt"); ok {
		t.Error(".dockerignore'd file was copied")
	}
	_, fi, ok := readInTemplate(t, tpl, "etc/secret.txt")
	if !ok || fi.Mode().Perm() != 0o600 || fi.Sys().(*syscall.Stat_t).Uid != 1000 {
		t.Errorf("secret.txt: %v %v, want app-owned 0600", ok, fi)
	}
	if tpl.DefaultUser != "app" || tpl.DefaultWorkdir != "/app" || tpl.Env["APP_HOME"] != "/app" || tpl.Env["GREETING"] != "hello" ||
		tpl.StartCmd != "echo serving" || tpl.ReadyCmd != "test -f /tmp/ready" || !slices.Equal(tpl.ExposedPorts, []int{8080, 9090}) ||
		!slices.Equal(tpl.Aliases, []string{"app"}) || !slices.Equal(tpl.Tags, []string{"v1"}) {
		t.Errorf("config: %+v", tpl)
	}
	if got, err := s.Get(context.Background(), "team-a", "app:v1"); err != nil || got.ID != tpl.ID {
		t.Errorf("Get(app:v1) = %v, %v", got, err)
	}
	if _, err := s.Get(context.Background(), "team-a", "app:v2"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Get(app:v2) = %v, want not found", err)
	}
	// The step sandboxes were asked for with the team, the build's layers
	// and the step's user, workdir and env.
	if len(runner.reqs) != 2 || runner.reqs[0].TeamID != "team-a" || runner.reqs[0].Commands[0].User != "root" ||
		runner.reqs[1].Commands[0].User != "app" || runner.reqs[0].Commands[0].Workdir != "/app" || len(runner.reqs[1].Layers) <= len(runner.reqs[0].Layers) {
		t.Errorf("step requests: %+v", runner.reqs)
	}

	// Unchanged: every layer step is cached and the template is the same.
	again, log2, err := buildDockerfile(t, s, runner, ctxDir, fullDockerfile, args)
	if err != nil {
		t.Fatalf("%v\n%s", err, log2)
	}
	if strings.Contains(log2, "done in") || strings.Count(log2, "cached") < 5 || again.ID != tpl.ID || !slices.Equal(again.LayerIDs, tpl.LayerIDs) {
		t.Errorf("rebuild was not served from the cache:\n%s", log2)
	}
	// A changed source rebuilds that COPY and what follows, not what precedes.
	writeFiles(t, ctxDir, map[string]string{"src/a.txt": "changed"})
	third, log3, err := buildDockerfile(t, s, runner, ctxDir, fullDockerfile, args)
	if err != nil {
		t.Fatalf("%v\n%s", err, log3)
	}
	if got, _, _ := readInTemplate(t, third, "app/src/a.txt"); got != "changed" {
		t.Errorf("changed file not rebuilt: %q", got)
	}
	if third.LayerIDs[len(third.LayerIDs)-1] == tpl.LayerIDs[len(tpl.LayerIDs)-1] || !slices.Equal(third.LayerIDs[:3], tpl.LayerIDs[:3]) {
		t.Errorf("cache reuse wrong:\n%v\n%v", tpl.LayerIDs, third.LayerIDs)
	}
	// GC drops the layers only the first build used, keeps the current ones.
	res, err := s.GC(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(res.RemovedLayers) == 0 || res.FreedBytes <= 0 || res.Usage.UnusedLayers != 0 {
		t.Errorf("gc: %+v", res)
	}
	for _, l := range third.Layers {
		if _, err := os.Stat(l); err != nil {
			t.Errorf("gc removed a used layer: %v", err)
		}
	}
}

func TestDockerfileBadInput(t *testing.T) {
	testutil.RequireRoot(t)
	s := newTestStore(t)
	ctxDir := t.TempDir()
	base := busyboxArchive(t)
	for _, tc := range []struct {
		name, dockerfile string
		want             []string
	}{
		{"unknown instruction", "FROM scratch\nFROBNICATE now\n", []string{"line 2", "FROBNICATE"}},
		{"multi-stage", "FROM scratch AS a\n", []string{"line 1", "multi-stage"}},
		{"no from", "RUN true\n", []string{"line 1", "before FROM"}},
		{"missing source", "FROM " + base + "\nCOPY nope.txt /\n", []string{"line 2", "nope.txt"}},
		{"escaping source", "FROM " + base + "\nCOPY ../../etc/passwd /\n", []string{"line 2", "outside the build context"}},
		{"failing run", "FROM " + base + "\nRUN fake-write first ok\nRUN fake-fail 3 failing-output\n", []string{"line 3", "exit code 3", "failing-output"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, log, err := buildDockerfile(t, s, &fakeRunner{}, ctxDir, tc.dockerfile, nil)
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("err = %v, want ErrInvalidArgument\n%s", err, log)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			var be *BuildError
			if tc.name == "failing run" && (!errors.As(err, &be) || be.ExitCode != 3 || be.Line != 3) {
				t.Errorf("BuildError %+v", be)
			}
		})
	}
	// No half template and no work dirs are left.
	if ts, _ := s.ListAll(context.Background()); len(ts) != 0 {
		t.Errorf("failed builds left templates: %v", ts)
	}
	entries, _ := os.ReadDir(s.layersRoot())
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), layerTmp) {
			t.Errorf("work dir %s left behind", e.Name())
		}
	}
	var mounts []byte
	mounts, _ = os.ReadFile("/proc/self/mountinfo")
	if bytes.Contains(mounts, []byte(s.Dir())) {
		t.Error("overlay mounts left behind")
	}
}
