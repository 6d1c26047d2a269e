package template

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/testutil"
)

// TestOperatorRunner builds a builtin-style layered definition over the
// cached base template: its command runs chrooted with /proc and /dev, and
// its writes land in the step's layer only.
func TestOperatorRunner(t *testing.T) {
	testutil.RequireRoot(t)
	src := os.Getenv("AGENTBOX_TEMPLATE_DIR")
	if src == "" {
		src = "/var/cache/agentbox/templates"
	}
	base := BuiltinDefinitions()["base"]
	baseID, _ := base.ID()
	if _, err := os.Stat(filepath.Join(src, baseID, metaFile)); err != nil {
		t.Skipf("no base template in %s (build it with `agentbox template build`)", src)
	}
	dir := t.TempDir()
	if out, err := exec.Command("cp", "-al", filepath.Join(src, baseID), dir).CombinedOutput(); err != nil {
		t.Fatalf("link base: %v %s", err, out)
	}
	s, err := NewStore(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	def := Definition{Name: "op-test", Base: &base, Run: []string{
		`test -r /proc/self/status && echo hi > /dev/null && echo "$(id -u) $PWD" > /op-test.txt`,
	}}
	var out bytes.Buffer
	tpl, err := s.Build(ctx, def, OperatorRunner{}, &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if !tpl.Builtin() {
		t.Errorf("an operator definition's template is not a builtin: %+v", tpl)
	}
	if got, _, ok := readInTemplate(t, tpl, "op-test.txt"); !ok || got != "0 /home/user\n" {
		t.Errorf("op-test.txt = %q (%v)", got, ok)
	}
	if _, err := os.Stat("/op-test.txt"); err == nil {
		t.Error("the command wrote to the host's root")
	}
	if b, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(b), dir) {
		t.Error("mounts left behind")
	}
}
