package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCLI drives a sandbox's life through the `agentbox` binary.
func TestCLI(t *testing.T) {
	s := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	run := func(stdin []byte, args ...string) (string, string, error) {
		cmd := exec.CommandContext(ctx, s.Bin, args...)
		cmd.Env = s.env()
		cmd.Stdin = bytes.NewReader(stdin)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		return out.String(), errb.String(), err
	}
	must := func(args ...string) string {
		t.Helper()
		out, errOut, err := run(nil, args...)
		if err != nil {
			t.Fatalf("agentbox %s: %v\nstdout: %s\nstderr: %s", strings.Join(args, " "), err, out, errOut)
		}
		return out
	}

	id := strings.TrimSpace(must("create", "base", "--timeout", "10m", "--metadata", "e2e=cli"))
	if id == "" || strings.ContainsAny(id, " \n") {
		t.Fatalf("create printed %q, want one sandbox ID", id)
	}
	defer func() { _, _, _ = run(nil, "kill", id) }()

	if out := must("exec", id, "--", "echo hi from $(whoami)"); out != "hi from user\n" {
		t.Errorf("exec stdout %q", out)
	}
	if out := must("exec", id, "--user", "root", "--cwd", "/etc", "--env", "A=1", "--", "echo $A $(pwd) $(whoami)"); out != "1 /etc root\n" {
		t.Errorf("exec with flags: %q", out)
	}
	_, _, err := run(nil, "exec", id, "--", "exit 3")
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || exitErr.ExitCode() != 3 {
		t.Errorf("exec of `exit 3` ended with %v, want exit code 3", err)
	}
	if out, _, err := run([]byte("piped\n"), "exec", id, "--", "cat"); err != nil || out != "piped\n" {
		t.Errorf("exec with stdin: %q %v", out, err)
	}

	// cp both ways, binary intact.
	dir := t.TempDir()
	blob := make([]byte, 1<<20+5)
	_, _ = rand.Read(blob)
	local := filepath.Join(dir, "blob.bin")
	if err := os.WriteFile(local, blob, 0o644); err != nil {
		t.Fatal(err)
	}
	must("cp", local, id+":/tmp/blob.bin")
	back := filepath.Join(dir, "back.bin")
	must("cp", id+":/tmp/blob.bin", back)
	if got, err := os.ReadFile(back); err != nil || !bytes.Equal(got, blob) {
		t.Errorf("cp round trip: %d bytes, %v", len(got), err)
	}

	if out := must("ls", "--metadata", "e2e=cli"); !strings.Contains(out, id) {
		t.Errorf("ls does not show %s:\n%s", id, out)
	}
	must("kill", id)
	if out := must("ls", "--metadata", "e2e=cli"); strings.Contains(out, id) {
		t.Errorf("ls still shows killed %s:\n%s", id, out)
	}
	if _, _, err := run(nil, "exec", id, "--", "true"); err == nil {
		t.Error("exec in a killed sandbox succeeded")
	}
}
