package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
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
	// sftp and scp (which speaks sftp) run the sandbox's sftp-server: the
	// host's is copied in over ssh's stdin, as the base template has none.
	const sftpServer = "/usr/lib/openssh/sftp-server"
	bin, err := os.ReadFile(sftpServer)
	if err != nil {
		t.Fatalf("the host's sftp-server is needed (scripts/install-deps.sh installs openssh-sftp-server): %v", err)
	}
	if out, errOut, code := run("ssh", string(bin), sshArgs(s.Bin, "root", id, "mkdir -p /usr/lib/openssh && cat > "+sftpServer+" && chmod 755 "+sftpServer)...); code != 0 {
		t.Fatalf("copy sftp-server in: exit %d: %s %s", code, out, errOut)
	}
	dir := t.TempDir()
	payload := make([]byte, 3<<20)
	_, _ = rand.Read(payload)
	if err := os.WriteFile(filepath.Join(dir, "up.bin"), payload, 0o600); err != nil {
		t.Fatal(err)
	}
	proxy := []string{"-F", "/dev/null", "-o", "ProxyCommand=" + s.Bin + " ssh --stdio %h", "-o", "StrictHostKeyChecking=no",
		"-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "BatchMode=yes"}
	if out, errOut, code := run("scp", "", append(proxy, filepath.Join(dir, "up.bin"), "user@"+id+":/home/user/up.bin")...); code != 0 {
		t.Fatalf("scp up: exit %d: %s %s", code, out, errOut)
	}
	if out, errOut, code := run("sftp", "get /home/user/up.bin "+filepath.Join(dir, "down.bin")+"\nls -l /home/user\n", append(proxy, "-b", "-", "user@"+id)...); code != 0 || !strings.Contains(out, "up.bin") {
		t.Fatalf("sftp get: exit %d: %s %s", code, out, errOut)
	}
	if got, err := os.ReadFile(filepath.Join(dir, "down.bin")); err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("the file came back different (%d bytes, %v)", len(got), err)
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
