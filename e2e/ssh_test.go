package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// sshArgs is the OpenSSH command line `agentbox ssh --help` documents, with
// bin as the ProxyCommand.
func sshArgs(bin, user, id string, cmd ...string) []string {
	return append([]string{"-F", "/dev/null", "-o", "ProxyCommand=" + bin + " ssh --stdio %h",
		"-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
		"-o", "BatchMode=yes", user + "@" + id}, cmd...)
}

// TestSSH runs commands in a sandbox with the real OpenSSH client through
// `agentbox ssh --stdio` as its ProxyCommand, and with `agentbox ssh`.
func TestSSH(t *testing.T) {
	if _, err := exec.LookPath("ssh"); err != nil {
		t.Fatal("the OpenSSH client is needed (scripts/install-deps.sh installs openssh-client)")
	}
	s := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	st, b, err := s.Do(ctx, s.APIKey, http.MethodPost, "/v2/sandboxes", map[string]any{"templateID": "base", "timeout": 600})
	if err != nil || st != http.StatusCreated {
		t.Fatalf("create: %d %s %v", st, b, err)
	}
	var created struct {
		SandboxID string `json:"sandboxID"`
	}
	if err := json.Unmarshal(b, &created); err != nil || created.SandboxID == "" {
		t.Fatalf("create answered %s (%v)", b, err)
	}
	id := created.SandboxID
	defer s.Do(context.Background(), s.APIKey, http.MethodDelete, "/sandboxes/"+id, nil)

	run := func(name string, stdin string, args ...string) (string, string, int) {
		t.Helper()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Env = s.env()
		cmd.Stdin = strings.NewReader(stdin)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		var exit *exec.ExitError
		switch {
		case errors.As(err, &exit):
			return out.String(), errb.String(), exit.ExitCode()
		case err != nil:
			t.Fatalf("%s %v: %v", name, args, err)
		}
		return out.String(), errb.String(), 0
	}
	for _, tc := range []struct {
		name      string
		bin       string
		args      []string
		stdin     string
		want      string
		wantErr   string
		wantCode  int
		sshClient bool
	}{
		{name: "openssh exec: output, stderr, exit status", bin: "ssh", args: sshArgs(s.Bin, "user", id, "echo hi from $(whoami); echo oops >&2; exit 7"),
			want: "hi from user\n", wantErr: "oops", wantCode: 7},
		{name: "openssh as root, host name with a suffix", bin: "ssh", args: sshArgs(s.Bin, "root", id+".sandbox", "id -u"), want: "0\n"},
		{name: "openssh stdin to the command", bin: "ssh", args: sshArgs(s.Bin, "user", id, "wc -c"), stdin: strings.Repeat("x", 100000), want: "100000\n"},
		{name: "openssh env", bin: "ssh", args: append([]string{"-o", "SetEnv=AGENTBOX_SSH_E2E=yes"}, sshArgs(s.Bin, "user", id, "echo $AGENTBOX_SSH_E2E")...), want: "yes\n"},
		{name: "openssh terminal", bin: "ssh", args: append([]string{"-tt"}, sshArgs(s.Bin, "user", id, "tty; stty size")...), want: "/dev/pts/"},
		{name: "agentbox ssh -- cmd", bin: s.Bin, args: []string{"ssh", id, "--", "echo", "via", "cli;", "exit", "3"}, want: "via cli\n", wantCode: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := run(tc.bin, tc.stdin, tc.args...)
			if code != tc.wantCode || !strings.Contains(out, tc.want) || !strings.Contains(errOut, tc.wantErr) {
				t.Fatalf("exit %d stdout %q stderr %q; want exit %d, stdout with %q, stderr with %q", code, out, errOut, tc.wantCode, tc.want, tc.wantErr)
			}
		})
	}
	// Every command is in the sandbox's audit log, as a terminal's is.
	st, b, err = s.Do(ctx, s.APIKey, http.MethodGet, "/v2/sandboxes/"+id+"/logs", nil)
	if err != nil || st != http.StatusOK {
		t.Fatalf("logs: %d %s %v", st, b, err)
	}
	for _, want := range []string{"echo hi from $(whoami); echo oops", "tty; stty size"} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("the audit log has no process start with %q: %.2000s", want, b)
		}
	}
}
