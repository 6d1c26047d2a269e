package template

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/testutil"
	"github.com/agentbox/agentbox/internal/untar"
)

// TestTemplateTenancy attacks template names from another team: every
// lookup resolves in the caller's team, then builtins and public
// templates; owner-only operations refuse everyone else.
func TestTemplateTenancy(t *testing.T) {
	ctx := context.Background()
	s, err := NewStore(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	def := BuiltinDefinitions()["base"]
	for _, tpl := range []*Template{
		{ID: "tbase", Aliases: []string{"base"}, Definition: &def, CreatedAt: now.Add(-time.Hour)},
		{ID: "tapriv", TeamID: "a", Aliases: []string{"app"}, Tags: []string{"v1"}, CreatedAt: now},
		{ID: "tapub", TeamID: "a", Aliases: []string{"shared"}, Public: true, CreatedAt: now},
		{ID: "tbapp", TeamID: "b", Aliases: []string{"shared"}, CreatedAt: now.Add(-time.Minute)},
		{ID: "torphan", Aliases: []string{"orphan"}, CreatedAt: now}, // no owner, not builtin, not public
	} {
		if err := s.Register(ctx, tpl); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		team, ref, want string // want "" = not found
	}{
		{"a", "app", "tapriv"},
		{"a", "app:v1", "tapriv"},
		{"a", "tapriv", "tapriv"},
		{"b", "app", ""},
		{"b", "app:v1", ""},
		{"b", "tapriv", ""},
		{"", "tapriv", ""},
		{"b", "base", "tbase"},
		{"b", "tbase", "tbase"},
		{"", "base", "tbase"},
		{"b", "tapub", "tapub"},
		{"b", "shared", "tbapp"}, // the team's own name first
		{"c", "shared", "tapub"}, // then the public one
		{"c", "orphan", ""},
		{"c", "torphan", ""},
	} {
		got, err := s.Get(ctx, tc.team, tc.ref)
		switch {
		case tc.want == "" && !errors.Is(err, errdefs.ErrNotFound):
			t.Errorf("team %q Get(%q) = %v, %v; want ErrNotFound", tc.team, tc.ref, got, err)
		case tc.want != "" && (err != nil || got.ID != tc.want):
			t.Errorf("team %q Get(%q) = %v, %v; want %s", tc.team, tc.ref, got, err, tc.want)
		}
	}
	list, _ := s.List(ctx, "b")
	var ids []string
	for _, x := range list {
		ids = append(ids, x.ID)
	}
	if strings.Join(ids, ",") != "tapub,tbapp,tbase" {
		t.Errorf("team b lists %v, want its own, the builtin and the public one", ids)
	}
	// Owner-only operations, tried by team b on team a's templates.
	if err := s.Delete(ctx, "b", "tapriv"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("b deletes a's template: %v", err)
	}
	if err := s.Delete(ctx, "b", "tapub"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("b deletes a's public template: %v", err)
	}
	if err := s.Delete(ctx, "b", "base"); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "operator") {
		t.Errorf("b deletes the builtin base: %v", err)
	}
	if _, err := s.Get(ctx, "a", "tapriv"); err != nil {
		t.Errorf("a's template is gone after b's attempts: %v", err)
	}
	// Reserved names and per-team IDs.
	if err := CheckName("b", "base"); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "reserved") {
		t.Errorf("a team build named base: %v", err)
	}
	if NamedID("a", "app", "v1") == NamedID("b", "app", "v1") {
		t.Error("two teams' builds of the same name get the same template ID")
	}
	if _, err := s.BuildFromSpec(ctx, BuildSpec{TeamID: "b", Name: "x", ID: "tapriv", From: "scratch"}, nil); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("b builds over a's template ID: %v", err)
	}
	if _, err := s.BuildFromSpec(ctx, BuildSpec{TeamID: "b", Name: "x", From: "tapriv"}, nil); err == nil || !strings.Contains(err.Error(), "tapriv") {
		t.Errorf("b builds FROM a's private template: %v", err)
	}
	// Publishing is the operator's flag.
	if _, err := s.SetPublic(ctx, "tapriv", true); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Get(ctx, "b", "tapriv"); err != nil || got.TeamID != "a" {
		t.Errorf("published template: %v, %v", got, err)
	}
}

// TestLocalImagesRefused: a team's FROM cannot name files on the server.
func TestLocalImagesRefused(t *testing.T) {
	s := newTestStore(t)
	for _, from := range []string{"oci:/etc", "docker-archive:/etc/shadow"} {
		_, err := s.BuildFromSpec(context.Background(), BuildSpec{TeamID: "b", Name: "x", From: from, FromImage: true}, nil)
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "operator builds only") {
			t.Errorf("FROM %s: %v", from, err)
		}
	}
}

// TestStepCacheScopedByTeam: team b repeating team a's exact inputs does
// not get a's RUN output (made under a's network policy and credentials).
func TestStepCacheScopedByTeam(t *testing.T) {
	ctx := context.Background()
	s := newTestStore(t)
	runner := &fakeRunner{}
	build := func(team string) *Template {
		t.Helper()
		tpl, err := s.BuildFromSpec(ctx, BuildSpec{TeamID: team, Name: "app", From: "scratch", Runner: runner,
			Steps: []Step{{Op: OpRun, Args: []string{"fake-write /secret made-for-{team}"}}}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return tpl
	}
	a := build("a")
	b := build("b")
	if runner.calls() != 2 {
		t.Errorf("runner ran %d times, want 2: team b was served team a's cached step", runner.calls())
	}
	if a.LayerIDs[len(a.LayerIDs)-1] == b.LayerIDs[len(b.LayerIDs)-1] {
		t.Error("two teams share a RUN layer")
	}
	if got, _, _ := readInTemplate(t, b, "secret"); got != "made-for-b\n" {
		t.Errorf("team b's layer holds %q", got)
	}
	build("a")
	if runner.calls() != 2 {
		t.Error("a team's own rebuild was not cached")
	}
}

// TestNoStoreWideLock: one team's build blocked in a RUN step does not stall
// another team's build.
func TestNoStoreWideLock(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := newTestStore(t)
	slow := &fakeRunner{release: make(chan struct{}), started: make(chan struct{}, 1)}
	done := make(chan error, 1)
	go func() {
		_, err := s.BuildFromSpec(ctx, BuildSpec{TeamID: "a", Name: "slow", From: "scratch", Runner: slow,
			Steps: []Step{{Op: OpRun, Args: []string{"fake-block"}}}}, nil)
		done <- err
	}()
	<-slow.started
	start := time.Now()
	if _, err := s.BuildFromSpec(ctx, BuildSpec{TeamID: "b", Name: "fast", From: "scratch", Runner: &fakeRunner{},
		Steps: []Step{{Op: OpRun, Args: []string{"fake-write /x y"}}}}, nil); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("team b's build waited %s for team a's", d)
	}
	// GC waits for neither build's layers to vanish: the blocked build's
	// parent layer is leased.
	res, err := s.GC(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.RemovedLayers) != 0 {
		t.Errorf("gc removed %v while a build stood on them", res.RemovedLayers)
	}
	close(slow.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func tarOf(t *testing.T, entries []tarEntry) []byte {
	t.Helper()
	return layerTar(t, entries)
}

// TestUploadsScopedAndVerified: uploads are per team, the server's digest
// is recorded, and a link that asks for verification refuses a mismatch.
func TestUploadsScopedAndVerified(t *testing.T) {
	s, err := NewStore(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	body := tarOf(t, []tarEntry{{name: "hello.txt", body: "hi"}})
	sum := sha256.Sum256(body)
	digest := hex.EncodeToString(sum[:])
	claimed := strings.Repeat("ab", 32)
	u, err := s.PutUpload("a", claimed, bytes.NewReader(body), 1<<20, false)
	if err != nil || u.Digest != digest {
		t.Fatalf("upload: %+v, %v", u, err)
	}
	if !s.HasUpload("a", claimed) || s.HasUpload("b", claimed) || s.HasUpload("", claimed) {
		t.Error("an upload is visible outside its team")
	}
	_, err = s.PutUpload("b", claimed, bytes.NewReader(body), 1<<20, true)
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), claimed) || !strings.Contains(err.Error(), digest) {
		t.Errorf("mismatched verified upload: %v", err)
	}
	if s.HasUpload("b", claimed) {
		t.Error("a refused upload was kept")
	}
	if _, err := s.PutUpload("b", digest, bytes.NewReader(body), 1<<20, true); err != nil {
		t.Errorf("matching verified upload: %v", err)
	}
	if _, err := s.PutUpload("b", digest, bytes.NewReader(body), 10, false); !errors.Is(err, errdefs.ErrTooLarge) {
		t.Errorf("oversized upload: %v", err)
	}
	// Team b cannot build from team a's upload by naming its hash.
	_, err = s.BuildFromSpec(context.Background(), BuildSpec{TeamID: "c", Name: "x", From: "scratch",
		Steps: []Step{{Op: OpCopy, Src: []string{"hello.txt"}, Dest: "/", FilesHash: claimed}}}, nil)
	if !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "not uploaded by this team") {
		t.Errorf("COPY from another team's upload: %v", err)
	}
}

// TestHostileUploads: the build author's archive cannot write outside its
// context, nor smuggle host files in through symlinks.
func TestHostileUploads(t *testing.T) {
	testutil.RequireRoot(t)
	ctx := context.Background()
	outside := t.TempDir()
	victim := filepath.Join(outside, "victim")
	os.WriteFile(victim, []byte("intact"), 0o644)
	for _, tc := range []struct {
		name    string
		entries []tarEntry
	}{
		{"dotdot", []tarEntry{{name: "../../../../../../" + strings.TrimPrefix(victim, "/"), body: "pwned"}}},
		{"symlink parent", []tarEntry{{name: "l", typ: tar.TypeSymlink, link: outside}, {name: "l/victim", body: "pwned"}}},
		{"hard link out", []tarEntry{{name: "h", typ: tar.TypeLink, link: "../../../../../../etc/shadow"}}},
		{"device", []tarEntry{{name: "mem", typ: tar.TypeChar, major: 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestStore(t)
			body := tarOf(t, tc.entries)
			h := strings.Repeat("cd", 32)
			if _, err := s.PutUpload("b", h, bytes.NewReader(body), 1<<20, false); err != nil {
				t.Fatal(err)
			}
			_, err := s.BuildFromSpec(ctx, BuildSpec{TeamID: "b", Name: "x", From: "scratch",
				Steps: []Step{{Op: OpCopy, Src: []string{"."}, Dest: "/", FilesHash: h}}}, nil)
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "unsafe entries refused") {
				t.Errorf("build: %v", err)
			}
			if b, _ := os.ReadFile(victim); string(b) != "intact" {
				t.Fatalf("file outside the context written: %q", b)
			}
		})
	}
	// A gzip bomb stops at the limit.
	dst := t.TempDir()
	big := tarOf(t, []tarEntry{{name: "big", body: strings.Repeat("0", 1<<20)}})
	if _, err := unpackArchive(ctx, bytes.NewReader(big), dst, untar.Limits{MaxBytes: 1 << 10}); !errors.Is(err, errdefs.ErrTooLarge) {
		t.Errorf("oversized context: %v", err)
	}
}

// TestCopySymlinkToHostFile: a context symlink to /etc/shadow is copied as
// a link (which inside a sandbox names the sandbox's own file), never as
// the host's file; a source reached through a symlinked directory is
// refused.
func TestCopySymlinkToHostFile(t *testing.T) {
	testutil.RequireRoot(t)
	ctx := context.Background()
	s := newTestStore(t)
	body := tarOf(t, []tarEntry{
		{name: "shadow", typ: tar.TypeSymlink, link: "/etc/shadow"},
		{name: "etc", typ: tar.TypeSymlink, link: "/etc"},
	})
	h := strings.Repeat("ef", 32)
	if _, err := s.PutUpload("b", h, bytes.NewReader(body), 1<<20, false); err != nil {
		t.Fatal(err)
	}
	tpl, err := s.BuildFromSpec(ctx, BuildSpec{TeamID: "b", Name: "x", From: "scratch",
		Steps: []Step{{Op: OpCopy, Src: []string{"shadow"}, Dest: "/copied", FilesHash: h}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	top := tpl.Layers[len(tpl.Layers)-1]
	fi, err := os.Lstat(filepath.Join(top, "copied"))
	if err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("copied: %v %v, want a symlink", fi, err)
	}
	if target, _ := os.Readlink(filepath.Join(top, "copied")); target != "/etc/shadow" {
		t.Errorf("link target %q", target)
	}
	_, err = s.BuildFromSpec(ctx, BuildSpec{TeamID: "b", Name: "y", From: "scratch",
		Steps: []Step{{Op: OpCopy, Src: []string{"etc/shadow"}, Dest: "/stolen", FilesHash: h}}}, nil)
	if err == nil {
		t.Fatal("COPY through a symlinked directory to the host's /etc/shadow succeeded")
	}
}
