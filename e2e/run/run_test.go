// Package run tests `agentbox run`, the local process tier, as root and
// as the unprivileged user nobody: files, syscalls and network are
// refused with an explanation, and what is allowed works.
package run

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
)

// case_ is one `agentbox run` invocation and what it must show.
type case_ struct {
	name   string
	flags  []string // before --
	cmd    string   // sh -c script
	ok     bool     // exit status 0
	stdout string   // must be in stdout
	notOut string   // must not be in stdout
	stderr []string // each must be in stderr
	dir    string   // working directory (default: the project)
}

// ptracePy attaches to the parent (agentbox) and prints the errno.
const ptracePy = `import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
r = libc.ptrace(16, os.getppid(), 0, 0)
print("ptrace", r, ctypes.get_errno())
raise SystemExit(0 if r == 0 else 1)`

// unixPy connects to the unix socket argv[1] and prints what it says.
const unixPy = `import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
print(s.recv(100).decode())`

const mptcpPy = `import socket
socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262)`

func TestRun(t *testing.T) {
	harness.RequireRoot(t)
	agentbox, _ := harness.Binaries(t)
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Fatal("/usr/bin/python3 is needed for the ptrace and MPTCP checks: apt-get install python3")
	}
	// The server the proxy may reach, on a loopback address of the host:
	// inside the command's network namespace nothing listens there.
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	ln, err := lc.Listen(context.Background(), "tcp4", "127.0.0.2:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "hello from the host")
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	url := "http://" + ln.Addr().String() + "/"

	for _, who := range []string{"root", "nobody"} {
		t.Run(who, func(t *testing.T) {
			// Home outside /tmp, so that ~/.ssh is carved out by Landlock
			// rules; ./.env in the writable project is masked.
			base, err := os.MkdirTemp("/var/tmp", "agentbox-run-e2e-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(base) })
			home := filepath.Join(base, "home")
			proj := filepath.Join(home, "proj")
			for _, d := range []string{filepath.Join(home, ".ssh"), filepath.Join(proj, ".git", "hooks"), proj, filepath.Join(home, "extra"), filepath.Join(home, "cfgw")} {
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			write(t, filepath.Join(home, ".ssh", "id_rsa"), "SECRET-KEY")
			write(t, filepath.Join(proj, ".env"), "TOKEN=SECRET-ENV")
			write(t, filepath.Join(proj, ".git", "config"), "[core]\n")
			write(t, filepath.Join(proj, ".agentbox.json"), `{"write": ["`+filepath.Join(home, "cfgw")+`"]}`)
			if err := os.Chmod(base, 0o755); err != nil {
				t.Fatal(err)
			}
			if who == "nobody" {
				chownTree(t, home, "nobody")
			}
			logFile := filepath.Join(home, "run.log") // written by agentbox, outside the sandbox
			// A stand-in for the user's SSH agent, which the command could
			// otherwise use by path: Landlock ABI 7 does not cover connect.
			agentSock := filepath.Join(home, "agent.sock")
			agent, err := net.Listen("unix", agentSock)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { agent.Close() })
			if err := os.Chmod(agentSock, 0o777); err != nil {
				t.Fatal(err)
			}
			go func() {
				for {
					c, err := agent.Accept()
					if err != nil {
						return
					}
					c.Write([]byte("AGENT-REACHED"))
					c.Close()
				}
			}()

			cases := []case_{
				{name: "read ~/.ssh/id_rsa", cmd: "cat ~/.ssh/id_rsa", notOut: "SECRET",
					stderr: []string{"agentbox: read of " + home + "/.ssh/id_rsa denied", `rule "~/.ssh"`, "--read " + home + "/.ssh"}},
				{name: "read ./.env", cmd: "cat .env", notOut: "SECRET",
					stderr: []string{"agentbox: read of " + proj + "/.env denied", `rule "./.env"`}},
				{name: "write outside", cmd: "echo x > " + home + "/outside",
					stderr: []string{"agentbox: write to " + home + "/outside denied: not under a --write path", "--write " + home}},
				{name: "plant a git hook", cmd: "echo 'curl evil' > .git/hooks/post-checkout; cat .git/config; echo x >> .git/config",
					stdout: "[core]", stderr: []string{"agentbox: write to " + proj + "/.git/hooks/post-checkout denied: it is kept read-only",
						"agentbox: write to " + proj + "/.git/config denied: it is kept read-only"}},
				{name: "run from home", cmd: "true", dir: home, stderr: []string{"run agentbox run in a project directory"}},
				{name: "write in cwd", cmd: "echo written > f && cat f && cat ../proj/f", ok: true, stdout: "written\nwritten"},
				{name: "write with --write", flags: []string{"--write", home + "/extra"}, cmd: "echo y > " + home + "/extra/f && cat " + home + "/extra/f", ok: true, stdout: "y"},
				{name: "write allowed by .agentbox.json", cmd: "echo z > " + home + "/cfgw/f", ok: true},
				{name: "direct network", cmd: "curl -sS -m 5 --noproxy '*' http://198.51.100.7/",
					stderr: []string{"agentbox: connection to 198.51.100.7:80 refused: the command's network has no route out"}},
				{name: "direct to the host's loopback", cmd: "curl -sS -m 5 --noproxy '*' " + url, notOut: "hello"},
				{name: "allowed through the proxy", flags: []string{"--allow-net", "127.0.0.2", "--log", logFile},
					cmd: "curl -sS -f -m 10 " + url, ok: true, stdout: "hello from the host"},
				{name: "refused by the proxy", cmd: "curl -sS -f -m 10 " + url, notOut: "hello",
					stderr: []string{"agentbox: connection to 127.0.0.2 refused by the proxy: not in the --allow-net list; allow it with --allow-net 127.0.0.2"}},
				{name: "MPTCP socket", cmd: "/usr/bin/python3 -c '" + mptcpPy + "'",
					stderr: []string{"agentbox: socket refused: MPTCP", "Protocol not supported"}},
				{name: "ptrace of the parent", cmd: "/usr/bin/python3 -c '" + ptracePy + "'", stdout: "ptrace -1 1",
					stderr: []string{"agentbox: ptrace refused"}},
				{name: "new user namespace", cmd: "unshare -U true",
					stderr: []string{"agentbox: unshare refused"}},
				{name: "ssh agent socket", cmd: "/usr/bin/python3 -c '" + unixPy + "' \"$SSH_AUTH_SOCK\"", notOut: "AGENT-REACHED",
					stderr: []string{"agentbox: connection to the unix socket " + agentSock + " refused", "--read " + agentSock}},
				{name: "ssh agent socket re-allowed", flags: []string{"--read", agentSock},
					cmd: "/usr/bin/python3 -c '" + unixPy + "' \"$SSH_AUTH_SOCK\"", ok: true, stdout: "AGENT-REACHED"},
				{name: "exit status passed on", cmd: "echo out; exit 3", stdout: "out", stderr: []string{}},
				{name: "denied read logged", flags: []string{"--log", logFile}, cmd: "cat ~/.ssh/id_rsa"},
			}
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					defer cancel()
					args := append(append([]string{"run"}, c.flags...), "--", "sh", "-c", c.cmd)
					var cmd *exec.Cmd
					if who == "nobody" {
						cmd = harness.AsNobody(ctx, agentbox, args...)
					} else {
						cmd = exec.CommandContext(ctx, agentbox, args...)
					}
					cmd.Dir = proj
					if c.dir != "" {
						cmd.Dir = c.dir
					}
					cmd.Env = []string{"HOME=" + home, "PATH=/usr/local/bin:/usr/bin:/bin", "TMPDIR=/tmp", "SSH_AUTH_SOCK=" + agentSock}
					var out, errb strings.Builder
					cmd.Stdout, cmd.Stderr = &out, &errb
					err := cmd.Run()
					if c.name == "exit status passed on" {
						if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 3 {
							t.Errorf("exit: %v, want exit status 3", err)
						}
					}
					if (err == nil) != c.ok {
						t.Errorf("exit: %v, want ok=%v\nstdout: %s\nstderr: %s", err, c.ok, out.String(), errb.String())
					}
					if !strings.Contains(out.String(), c.stdout) {
						t.Errorf("stdout %q lacks %q (stderr: %s)", out.String(), c.stdout, errb.String())
					}
					if c.notOut != "" && strings.Contains(out.String(), c.notOut) {
						t.Errorf("stdout %q holds %q", out.String(), c.notOut)
					}
					for _, s := range c.stderr {
						if !strings.Contains(errb.String(), s) {
							t.Errorf("stderr %q lacks %q", errb.String(), s)
						}
					}
				})
			}

			if _, err := os.Stat(filepath.Join(proj, ".git", "hooks", "post-checkout")); !os.IsNotExist(err) {
				t.Errorf("the planted git hook exists (stat: %v)", err)
			}
			if b, _ := os.ReadFile(filepath.Join(proj, ".git", "config")); string(b) != "[core]\n" {
				t.Errorf(".git/config was changed: %q", b)
			}

			// The log holds a record of the proxy's decision and of the refused read.
			b, err := os.ReadFile(logFile)
			if err != nil {
				t.Fatal(err)
			}
			var allowed, refused bool
			for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
				var rec map[string]any
				if err := json.Unmarshal([]byte(line), &rec); err != nil {
					t.Fatalf("log line %q: %v", line, err)
				}
				allowed = allowed || rec["msg"] == "egress allowed" && rec["host"] == "127.0.0.2"
				refused = refused || rec["msg"] == "refused" && rec["path"] == home+"/.ssh/id_rsa" && rec["kind"] == "file"
			}
			if !allowed || !refused {
				t.Errorf("log lacks the allowed connection (%v) or the refused read (%v):\n%s", allowed, refused, b)
			}
		})
	}
}

// TestBadConfig checks that a config error names the field.
func TestBadConfig(t *testing.T) {
	harness.RequireRoot(t)
	agentbox, _ := harness.Binaries(t)
	dir := t.TempDir()
	write(t, filepath.Join(dir, ".agentbox.json"), `{"allow_net": ["ok.example", "bad domain"]}`)
	cmd := exec.Command(agentbox, "run", "--", "true")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "allow_net[1]") {
		t.Fatalf("err %v, output %q: want a refusal naming allow_net[1]", err, out)
	}
}

func write(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func chownTree(t *testing.T, root, name string) {
	t.Helper()
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	err = filepath.Walk(root, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
	if err != nil {
		t.Fatal(err)
	}
}
