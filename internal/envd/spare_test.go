package envd

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/agentbox/agentbox/api/gen/process"
)

// whoAmI prints what a command can see of its own start: its reaper's
// command line (ppid), whether the reaper leads the command's session and
// group, the terminal and its foreground group, uid, gid, groups, cwd and
// one variable.
const whoAmI = `s=$(cat /proc/$$/stat); s=${s##*) }; set -- $s
echo "reaper=$(tr '\0' ' ' </proc/$2/cmdline)"
[ "$3" = "$2" ] && [ "$4" = "$2" ] && echo "leads=yes"
[ "$5" != 0 ] && [ "$6" = "$3" ] && echo "ctty=yes"
echo "id=$(id -u) $(id -G) cwd=$PWD v=$V nice=$(cut -d' ' -f19 /proc/$$/stat)"`

// waitSpare waits until the server has a spare reaper parked.
func waitSpare(t *testing.T, s *Server) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.spares.mu.Lock()
		ready := s.spares.spare != nil
		s.spares.mu.Unlock()
		if ready {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no spare reaper was started after a command")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// spareKept says whether s has a spare reaper parked or on its way.
func spareKept(s *Server) bool {
	s.spares.mu.Lock()
	defer s.spares.mu.Unlock()
	return s.spares.spare != nil || s.spares.starting
}

// TestSpareReaperRunsCommandsLikeAFreshOne runs the same commands on a
// fresh reaper (the first command of a server has none spare) and on spare
// reapers, and wants the same view from inside: own session and group led
// by the reaper, the user, groups, cwd, env, exit code, stdin and terminal.
func TestSpareReaperRunsCommandsLikeAFreshOne(t *testing.T) {
	e := newTestEnv(t, "")
	c := e.processClient(nil)
	cwd := "/tmp"
	yes := true
	tests := []struct {
		name     string
		req      *connect.Request[process.StartRequest]
		input    string
		wantOut  []string
		wantCode int32
	}{
		{name: "default user", req: startReq(whoAmI+"; exit 3", func(r *process.StartRequest) { r.Process.Envs = map[string]string{"V": "x y"} }),
			wantOut: []string{"leads=yes", "id=12345 12345 23456 cwd=" + e.home + " v=x y nice=0"}, wantCode: 3},
		{name: "root and cwd", req: withHeader(startReq(whoAmI, func(r *process.StartRequest) { r.Process.Cwd = &cwd }), "Authorization", "Basic cm9vdDo="),
			wantOut: []string{"leads=yes", "id=0 0 cwd=/tmp v= nice=0"}},
		{name: "stdin", req: startReq("read -r l; echo got=$l", func(r *process.StartRequest) { r.Stdin = &yes }), input: "hello\n",
			wantOut: []string{"got=hello"}},
		{name: "terminal", req: connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", whoAmI}}, Pty: &process.PTY{Size: &process.PTY_Size{Cols: 80, Rows: 24}}}),
			wantOut: []string{"leads=yes", "ctty=yes"}},
		{name: "killed by signal", req: startReq("kill -9 $$"), wantCode: -1},
	}
	e.srv.spares.close() // first on fresh reapers: none parked, none started
	for _, spare := range []bool{false, true} {
		if spare {
			e.srv.spares = &spares{exe: e.srv.reaper, children: e.srv.children}
			run(t, c, startReq("true"))
			if spareKept(e.srv) {
				t.Fatal("one command started a spare reaper: every sandbox that ran a command would keep an extra process")
			}
			run(t, c, startReq("true")) // in succession: starts the first spare
		}
		for _, tt := range tests {
			t.Run(map[bool]string{false: "fresh/", true: "spare/"}[spare]+tt.name, func(t *testing.T) {
				if spare {
					waitSpare(t, e.srv)
				}
				s, err := c.Start(ctxT(t), tt.req)
				if err != nil {
					t.Fatal(err)
				}
				if !s.Receive() {
					t.Fatal(s.Err())
				}
				pid := s.Msg().GetEvent().GetStart().GetPid()
				if tt.input != "" {
					sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}
					if _, err := c.SendInput(ctxT(t), connect.NewRequest(&process.SendInputRequest{Process: sel, Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte(tt.input)}}})); err != nil {
						t.Fatal(err)
					}
				}
				r := collect[*process.StartResponse](s)
				out := r.stdout.String() + r.pty.String()
				for _, w := range tt.wantOut {
					if !strings.Contains(out, w) {
						t.Errorf("output %q lacks %q", out, w)
					}
				}
				if tt.name != "stdin" && tt.name != "killed by signal" {
					// A fresh reaper of a command run as a user names its ids.
					wantReaper := map[bool]string{false: " -- /bin/bash", true: "reap --spare"}[spare]
					if !strings.Contains(out, wantReaper) || !spare && !strings.Contains(out, "envd reap ") {
						t.Errorf("output %q: the reaper is not a %q one", out, wantReaper)
					}
				}
				if r.end.GetExitCode() != tt.wantCode {
					t.Errorf("exit code %d, want %d (end %v, err %v)", r.end.GetExitCode(), tt.wantCode, r.end, r.err)
				}
			})
		}
	}

	// A sandbox started again (/init, also after a restore from a snapshot
	// taken amid commands) keeps no spare until commands come in succession.
	run(t, c, startReq("true"))
	waitSpare(t, e.srv)
	if resp := e.do("POST", "/init", jsonBody(map[string]any{}), nil); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("init: %d", resp.StatusCode)
	}
	run(t, c, startReq("true"))
	if spareKept(e.srv) {
		t.Error("a spare reaper outlived /init, or the first command after it started one")
	}
}

// TestSpareReaperDeathStartsTheCommandAnyway kills the parked spare (as
// sandbox root could) before a command reaches it and while a command
// waits for it: the command must run once, under a reaper of its own.
func TestSpareReaperDeathStartsTheCommandAnyway(t *testing.T) {
	e := newTestEnv(t, "")
	c := e.processClient(nil)
	for _, tt := range []struct {
		name  string
		whenQ bool // kill it while the command is queued to it, not before
	}{{"killed before", false}, {"killed while the command waits", true}} {
		t.Run(tt.name, func(t *testing.T) {
			run(t, c, startReq("true"))
			run(t, c, startReq("true"))
			waitSpare(t, e.srv)
			e.srv.spares.mu.Lock()
			spare := e.srv.spares.spare.cmd.Process
			e.srv.spares.mu.Unlock()
			if !tt.whenQ {
				_ = spare.Kill()
				time.Sleep(100 * time.Millisecond)
			} else {
				_ = spare.Signal(syscall.SIGSTOP)
				go func() {
					time.Sleep(300 * time.Millisecond)
					_ = spare.Kill()
				}()
			}
			marker := filepath.Join(e.home, "ran-"+strings.ReplaceAll(tt.name, " ", "-"))
			r := run(t, c, startReq("echo x >> "+marker+"; echo ran"))
			if r.err != nil || r.stdout.String() != "ran\n" || r.end.GetExitCode() != 0 {
				t.Fatalf("stdout %q end %v err %v", r.stdout.String(), r.end, r.err)
			}
			if b, _ := os.ReadFile(marker); string(b) != "x\n" {
				t.Errorf("the command ran %d times, want once", strings.Count(string(b), "x"))
			}
		})
	}
}
