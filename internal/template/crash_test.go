package template

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCrashStepsNamed(t *testing.T) {
	seen := map[string]bool{}
	for _, p := range CrashSteps() {
		if p[0] != OpUpload && p[0] != OpBuild || p[1] == "" || seen[p[0]+"/"+p[1]] {
			t.Errorf("crash point %v: want a named step of %s or %s, once", p, OpUpload, OpBuild)
		}
		seen[p[0]+"/"+p[1]] = true
	}
}

// TestStartupRemovesHalfMadeUploads: what a crash leaves in an upload
// directory goes when the server opens its builds; stored uploads stay.
func TestStartupRemovesHalfMadeUploads(t *testing.T) {
	s, err := NewStore(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	kept := strings.Repeat("a", 64)
	orphan := strings.Repeat("b", 64)
	dir := s.uploadDir("team-1")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	files := map[string]bool{ // name: survives
		kept + ".tar":        true,
		kept + ".json":       true,
		orphan + ".tar":      false, // renamed, record never written
		orphan + ".json.tmp": false,
		".part-123":          false,
	}
	for name := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := NewBuilds(context.Background(), s, nil, nil); err != nil {
		t.Fatal(err)
	}
	for name, want := range files {
		_, err := os.Stat(filepath.Join(dir, name))
		if got := err == nil; got != want {
			t.Errorf("%s present = %v after startup, want %v", name, got, want)
		}
	}
}
