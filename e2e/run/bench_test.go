package run

import (
	"os/exec"
	"testing"

	"github.com/agentbox/agentbox/e2e/harness"
)

// openMany opens 2000 files: the cost of sending every open through
// agentbox for explanations (--explain-files, the default).
const openMany = `import glob
fs = [f for f in glob.glob("/usr/lib/python3*/**/*.py", recursive=True)][:2000]
for f in fs:
    open(f).close()`

// BenchmarkRun compares `agentbox run CMD` with CMD:
//
//	AGENTBOX_REQUIRE_ROOT=1 go test -run '^$' -bench . -benchtime 30x ./e2e/run
func BenchmarkRun(b *testing.B) {
	harness.RequireRoot(b)
	agentbox, _ := harness.Binaries(b)
	for _, bc := range []struct {
		name string
		args []string
	}{
		{"true", []string{"true"}},
		{"agentbox_run_true", []string{agentbox, "run", "--", "true"}},
		{"agentbox_run_no_explain_true", []string{agentbox, "run", "--explain-files=false", "--", "true"}},
		{"open_2000_files", []string{"/usr/bin/python3", "-c", openMany}},
		{"agentbox_run_open_2000_files", []string{agentbox, "run", "--", "/usr/bin/python3", "-c", openMany}},
		{"agentbox_run_no_explain_open_2000_files", []string{agentbox, "run", "--explain-files=false", "--", "/usr/bin/python3", "-c", openMany}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			dir := b.TempDir()
			for b.Loop() {
				cmd := exec.Command(bc.args[0], bc.args[1:]...)
				cmd.Dir = dir
				if out, err := cmd.CombinedOutput(); err != nil {
					b.Fatalf("%v: %v\n%s", bc.args, err, out)
				}
			}
		})
	}
}
