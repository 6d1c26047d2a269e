package lifecycle

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/wire"
)

// memCheck holds 300 MiB of random bytes, writes their SHA-256 to
// /tmp/sum, and each time /tmp/go appears sums the same bytes again into
// /tmp/sum2: a page lost or zeroed by a lazy restore changes the sum.
const memCheck = `import hashlib,os,time
b=bytearray(os.urandom(300<<20))
open('/tmp/sum.tmp','w').write(hashlib.sha256(b).hexdigest()); os.rename('/tmp/sum.tmp','/tmp/sum')
while True:
    if os.path.exists('/tmp/go'):
        os.remove('/tmp/go')
        open('/tmp/sum2.tmp','w').write(hashlib.sha256(b).hexdigest()); os.rename('/tmp/sum2.tmp','/tmp/sum2')
    time.sleep(0.05)
`

// lazySandbox creates a sandbox whose python holds memCheck's bytes and
// returns it with their sum.
func lazySandbox(t *testing.T, s *server, c *wire.Client) (*wire.Sandbox, string) {
	t.Helper()
	ctx := context.Background()
	st, b := s.do("POST", "/v2/sandboxes", map[string]any{"templateID": "base", "timeout": 600, "memoryMB": 1024}, nil)
	if st != http.StatusCreated {
		t.Fatalf("create: %d %s", st, b)
	}
	var sb wire.Sandbox
	if err := json.Unmarshal(b, &sb); err != nil {
		t.Fatal(err)
	}
	if r, err := c.Run(ctx, &sb, "", "cat > /tmp/memcheck.py <<'EOF'\n"+memCheck+"EOF\nnohup python3 /tmp/memcheck.py >/tmp/memcheck.log 2>&1 &"); err != nil || r.ExitCode != 0 {
		t.Fatalf("start the memory holder: %v %+v", err, r)
	}
	return &sb, waitFile(t, c, &sb, "/tmp/sum")
}

// waitFile waits for a file in the sandbox and returns its content.
func waitFile(t *testing.T, c *wire.Client, sb *wire.Sandbox, path string) string {
	t.Helper()
	for range 1200 {
		r, err := c.Run(context.Background(), sb, "", "cat "+path+" 2>/dev/null || true")
		if err != nil {
			t.Fatalf("read %s: %v", path, err)
		}
		if out := strings.TrimSpace(r.Stdout); out != "" {
			return out
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s never appeared", path)
	return ""
}

// checkSum has the memory holder sum its bytes again and compares.
func checkSum(t *testing.T, c *wire.Client, sb *wire.Sandbox, want string) {
	t.Helper()
	if r, err := c.Run(context.Background(), sb, "", "rm -f /tmp/sum2; touch /tmp/go"); err != nil || r.ExitCode != 0 {
		t.Fatalf("ask for the sum: %v %+v", err, r)
	}
	if got := waitFile(t, c, sb, "/tmp/sum2"); got != want {
		t.Fatalf("memory changed across the resume: sha256 %s, want %s", got, want)
	}
}

// lazyLeftovers lists what a lazy resume may leave behind: page daemons
// serving the server's data dir, their records and their sockets.
func lazyLeftovers(t *testing.T, dataDir string) []string {
	t.Helper()
	var left []string
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		cmd := strings.ReplaceAll(string(b), "\x00", " ")
		if strings.Contains(cmd, "lazy-pages") && strings.Contains(cmd, dataDir) {
			left = append(left, "process: "+cmd)
		}
	}
	for _, pat := range []string{"*/lazy-pages.pid", "*/*/lazy-pages.socket", "*/checkpoint"} {
		m, _ := filepath.Glob(filepath.Join(dataDir, "sandboxes", pat))
		left = append(left, m...)
	}
	return left
}

// waitNoLeftovers waits until every page daemon has finished.
func waitNoLeftovers(t *testing.T, dataDir string) {
	t.Helper()
	var left []string
	for range 600 {
		if left = lazyLeftovers(t, dataDir); len(left) == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("left behind after a lazy resume: %v", left)
}

// TestLazyResume pauses a sandbox holding 300 MiB and resumes it lazily:
// it answers a command, every byte is intact, and once its memory is in
// the page daemon, its socket and the pause image are gone.
func TestLazyResume(t *testing.T) {
	s := newServer(t)
	s.Restart(t, "--lazy-resume-mb", "200")
	c := wire.New(s.URL, s.APIKey)
	sb, sum := lazySandbox(t, s, c)
	if st, b := s.do("POST", "/sandboxes/"+sb.SandboxID+"/pause", nil, nil); st != http.StatusNoContent {
		t.Fatalf("pause: %d %s", st, b)
	}
	if st, b := s.do("POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", map[string]any{"timeout": 600}, nil); st != http.StatusCreated {
		t.Fatalf("connect: %d %s", st, b)
	}
	if r, err := c.Run(context.Background(), sb, "", "echo up"); err != nil || strings.TrimSpace(r.Stdout) != "up" {
		t.Fatalf("first command after the resume: %v %+v", err, r)
	}
	checkSum(t, c, sb, sum)
	waitNoLeftovers(t, s.DataDir)
	logs := s.LogTail(400)
	if !strings.Contains(logs, "lazy resume: all memory loaded") {
		t.Fatalf("the resume was not lazy; server log:\n%s", logs)
	}
	// Pausing again works on the lazily restored sandbox.
	if st, b := s.do("POST", "/sandboxes/"+sb.SandboxID+"/pause", nil, nil); st != http.StatusNoContent {
		t.Fatalf("second pause: %d %s", st, b)
	}
	if st, b := s.do("POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", map[string]any{"timeout": 600}, nil); st != http.StatusCreated {
		t.Fatalf("second connect: %d %s", st, b)
	}
	checkSum(t, c, sb, sum)
	if st, b := s.do("DELETE", "/sandboxes/"+sb.SandboxID, nil, nil); st != http.StatusNoContent {
		t.Fatalf("kill: %d %s", st, b)
	}
	waitNoLeftovers(t, s.DataDir)
}

// TestLazyResumeCrash kills the server during a lazy resume: right after
// the restore (the page daemon still loading memory) and at an arbitrary
// point of the call. The next server finds the sandbox running or paused,
// its memory intact, and nothing of the resume is left once it settles.
func TestLazyResumeCrash(t *testing.T) {
	s := newServer(t)
	s.stop(syscall.SIGTERM)
	for _, tc := range []struct {
		name  string
		flags []string
		kill  func()
	}{
		{name: "after restore", flags: []string{"--fault-step", "resume:restored"}, kill: func() {
			if !s.waitExit(2 * time.Minute) {
				s.t.Fatal("server did not exit at resume:restored")
			}
		}},
		{name: "mid restore", kill: func() {
			time.Sleep(150 * time.Millisecond)
			s.stop(syscall.SIGKILL)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s.t = t
			s.start(append([]string{"--lazy-resume-mb", "200"}, tc.flags...)...)
			c := wire.New(s.URL, s.APIKey)
			sb, sum := lazySandbox(t, s, c)
			if st, b := s.do("POST", "/sandboxes/"+sb.SandboxID+"/pause", nil, nil); st != http.StatusNoContent {
				t.Fatalf("pause: %d %s", st, b)
			}
			go s.do("POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", map[string]any{"timeout": 600}, nil)
			tc.kill()
			s.start("--lazy-resume-mb", "200")
			switch got := s.state(sb.SandboxID); got {
			case "running":
			case "paused":
				if st, b := s.do("POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", map[string]any{"timeout": 600}, nil); st != http.StatusCreated {
					t.Fatalf("connect after the crash: %d %s", st, b)
				}
			default:
				t.Fatalf("after a crash during a lazy resume the sandbox is %q, want running or paused", got)
			}
			checkSum(t, c, sb, sum)
			waitNoLeftovers(t, s.DataDir)
			if st, b := s.do("DELETE", "/sandboxes/"+sb.SandboxID, nil, nil); st != http.StatusNoContent {
				t.Fatalf("kill: %d %s", st, b)
			}
			waitNoLeftovers(t, s.DataDir)
			s.stop(syscall.SIGTERM)
		})
	}
}
