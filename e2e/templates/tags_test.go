package templates

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestE2BTemplateTags drives the tag endpoints with Template.assignTags,
// getTags and removeTags from the official e2b npm SDK, on a template of the
// team (builtins such as base are the operator's and refused).
func TestE2BTemplateTags(t *testing.T) {
	e := setup(t)
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("needs node")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "tags.mjs")
	cmd.Env = append(os.Environ(), "E2B_API_URL=http://"+e.addr, "E2B_API_KEY="+e.key,
		"E2B_MODULE="+filepath.Join(e.root, "e2e/js/node_modules/e2b/dist/index.mjs"), "TEMPLATE_NAME=e2e-tags")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node: %v\n%s\n%s", err, out, stderr.String())
	}
	var r struct {
		Assigned struct {
			BuildID string `json:"buildId"`
			Tags    []string
		}
		Listed []struct {
			Tag     string
			BuildID string `json:"buildId"`
		}
		Exists       bool
		AfterRemove  []string
		UnknownError string
		BuiltinError string
	}
	if err := json.Unmarshal(bytes.TrimSpace(out), &r); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if r.Assigned.BuildID == "" || !slices.Equal(r.Assigned.Tags, []string{"e2e-stable", "e2e-canary"}) {
		t.Errorf("assignTags = %+v", r.Assigned)
	}
	var listed []string
	for _, l := range r.Listed {
		listed = append(listed, l.Tag)
		if l.BuildID != r.Assigned.BuildID {
			t.Errorf("tag %s has build %s, want %s", l.Tag, l.BuildID, r.Assigned.BuildID)
		}
	}
	slices.Sort(listed)
	if !slices.Equal(listed, []string{"default", "e2e-canary", "e2e-stable"}) {
		t.Errorf("getTags = %v", listed)
	}
	if !r.Exists {
		t.Error("e2e-tags:e2e-stable does not exist after assigning it")
	}
	if !slices.Equal(r.AfterRemove, []string{"default", "e2e-stable"}) {
		t.Errorf("tags after removing e2e-canary: %v", r.AfterRemove)
	}
	if !strings.Contains(r.BuiltinError, "400") {
		t.Errorf("a team tagging the builtin base: %q, want a 400", r.BuiltinError)
	}
	if !strings.Contains(r.UnknownError, "404") {
		t.Errorf("assigning to an unknown template: %q", r.UnknownError)
	}
}
