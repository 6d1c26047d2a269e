package envd

import (
	"bytes"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/agentbox/agentbox/api/gen/process"
	"github.com/agentbox/agentbox/api/gen/process/processconnect"
)

// whoAmI prints what a command can see of its own start: its reaper's
// pid and command line (ppid), whether the reaper or the command itself
// leads the command's session and group, the terminal and its foreground
// group, uid, gid, groups, cwd and one variable.
const whoAmI = `s=$(cat /proc/$$/stat); s=${s##*) }; set -- $s
echo "reaper=$(tr '\0' ' ' </proc/$2/cmdline) reaperpid=$2."
[ "$3" = "$2" ] && [ "$4" = "$2" ] && echo "leads=reaper"
[ "$3" = "$$" ] && [ "$4" = "$$" ] && echo "leads=command"
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
	return s.spares.spare != nil
}

// TestSpareReaperRunsCommandsLikeAFreshOne runs the same commands under a
// reaper of their own ("envd reap --"), under a new reusable reaper (none
// parked) and under a reused one, and wants the same view from inside: a
// session and group led by the reaper, the user, groups, cwd, env, exit
// code, stdin and terminal.
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
			wantOut: []string{"id=12345 12345 23456 cwd=" + e.home + " v=x y nice=0"}, wantCode: 3},
		{name: "root and cwd", req: withHeader(startReq(whoAmI, func(r *process.StartRequest) { r.Process.Cwd = &cwd }), "Authorization", "Basic cm9vdDo="),
			wantOut: []string{"id=0 0 cwd=/tmp v= nice=0"}},
		{name: "stdin", req: startReq("read -r l; echo got=$l", func(r *process.StartRequest) { r.Stdin = &yes }), input: "hello\n",
			wantOut: []string{"got=hello"}},
		{name: "terminal", req: connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", whoAmI}}, Pty: &process.PTY{Size: &process.PTY_Size{Cols: 80, Rows: 24}}}),
			wantOut: []string{"ctty=yes"}},
		{name: "killed by signal", req: startReq("kill -9 $$"), wantCode: -1},
	}
	e.srv.spares.close()
	for _, mode := range []string{"own", "new", "reused"} {
		switch mode {
		case "own": // no reusable reapers at all
			e.srv.spares = &spares{children: e.srv.children}
		case "new": // none parked: each command starts one, ended after it
			e.srv.spares = &spares{exe: e.srv.reaper, children: e.srv.children, closed: true}
		case "reused":
			e.srv.spares = &spares{exe: e.srv.reaper, children: e.srv.children}
			run(t, c, startReq("true"))
			time.Sleep(100 * time.Millisecond)
			if spareKept(e.srv) {
				t.Fatal("one command left a reaper parked: every sandbox that ran a command would keep an extra process")
			}
			run(t, c, startReq("true")) // in succession: its reaper is parked after it
		}
		for _, tt := range tests {
			t.Run(mode+"/"+tt.name, func(t *testing.T) {
				if mode == "reused" {
					if !spareKept(e.srv) {
						run(t, c, startReq("true")) // after a terminal: see below
					}
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
				if strings.Contains(out, "reaper=") {
					// The reaper leads the command's session and group
					// (CRIU restores no session whose leader is gone); a
					// reaper of its own names the command and its user's ids.
					wantReaper := " -- /bin/bash"
					if mode != "own" {
						wantReaper = "reap --spare"
					}
					if !strings.Contains(out, wantReaper) || !strings.Contains(out, "leads=reaper") || mode == "own" && !strings.Contains(out, "envd reap ") {
						t.Errorf("output %q: want a %q reaper leading the session", out, wantReaper)
					}
				}
				if r.end.GetExitCode() != tt.wantCode {
					t.Errorf("exit code %d, want %d (end %v, err %v)", r.end.GetExitCode(), tt.wantCode, r.end, r.err)
				}
				// A session keeps the first terminal it takes: the reaper
				// that gave one serves no other command.
				if mode == "reused" && tt.name == "terminal" && spareKept(e.srv) {
					t.Error("the reaper of a terminal command was parked for another")
				}
			})
		}
	}

	// A sandbox started again (/init, also after a restore from a snapshot
	// taken amid commands) keeps no reaper until commands come in succession.
	run(t, c, startReq("true"))
	waitSpare(t, e.srv)
	if resp := e.do("POST", "/init", jsonBody(map[string]any{}), nil); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("init: %d", resp.StatusCode)
	}
	run(t, c, startReq("true"))
	time.Sleep(100 * time.Millisecond)
	if spareKept(e.srv) {
		t.Error("a reaper outlived /init, or the first command after it left one parked")
	}
}

// reaperOf runs whoAmI and returns the pid of the command's reaper.
func reaperOf(t *testing.T, c processconnect.ProcessClient) string {
	t.Helper()
	r := run(t, c, startReq(whoAmI))
	_, after, ok := strings.Cut(r.stdout.String(), "reaperpid=")
	pid, _, ok2 := strings.Cut(after, ".")
	if !ok || !ok2 || r.end.GetExitCode() != 0 {
		t.Fatalf("whoAmI: stdout %q end %v err %v", r.stdout.String(), r.end, r.err)
	}
	return pid
}

// TestReaperIsReusedOnlyOnceItsTreeIsGone: successive commands run under
// one reaper (no envd start per command), a command whose background
// processes live on keeps its reaper to itself (the next command gets
// another one, so a kill of either ends only its own tree), and the reaper
// serves again once they are gone.
func TestReaperIsReusedOnlyOnceItsTreeIsGone(t *testing.T) {
	e := newTestEnv(t, "")
	c := e.processClient(nil)
	run(t, c, startReq("true"))
	first := reaperOf(t, c) // in succession: parked after it
	// A command that leaves nothing running frees its reaper before its
	// end reaches the client, so a next command sent at once finds it.
	for range 5 {
		if !spareKept(e.srv) {
			t.Fatal("no reaper parked when the command's end arrived")
		}
		if again := reaperOf(t, c); again != first {
			t.Fatalf("the next command ran under reaper %s, not the parked %s", again, first)
		}
	}

	// Background processes outlive the command: its reaper stays theirs.
	mark := 8000 + os.Getpid()%1000*10
	t.Cleanup(func() {
		for _, pid := range alive(mark) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	bg := run(t, c, startReq("{ "+escapees(mark)+" } >/dev/null 2>&1; echo $PPID"))
	held := strings.TrimSpace(bg.stdout.String())
	if held != first {
		t.Fatalf("the background command ran under reaper %s, not the parked %s", held, first)
	}
	for deadline := time.Now().Add(5 * time.Second); len(alive(mark)) != 3; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of 3 background processes running", len(alive(mark)))
		}
	}
	// The double-forked one (escapees' second) is still in the session its
	// reaper leads: a session whose leader lives on, which CRIU can
	// checkpoint (a command leading its own session would leave it
	// leaderless once it returned).
	if sid := sessionOf(t, sleepers(mark+1)); sid != held {
		t.Fatalf("a background process is in session %s, not its reaper's (%s)", sid, held)
	}
	other := reaperOf(t, c)
	if other == held {
		t.Fatal("a command ran under the reaper of another command's live background processes")
	}
	// The second command's kill must not reach the first one's tree.
	s, err := c.Start(ctxT(t), startReq("echo up; sleep 600"))
	if err != nil {
		t.Fatal(err)
	}
	var pid uint32
	for s.Receive() {
		ev := s.Msg().GetEvent()
		if st := ev.GetStart(); st != nil {
			pid = st.GetPid()
		}
		if d := ev.GetData(); d != nil && bytes.Contains(d.GetStdout(), []byte("up")) {
			break
		}
	}
	if _, err := c.SendSignal(ctxT(t), connect.NewRequest(&process.SendSignalRequest{
		Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}, Signal: process.Signal_SIGNAL_SIGKILL,
	})); err != nil {
		t.Fatal(err)
	}
	for s.Receive() {
	}
	if n := len(alive(mark)); n != 3 {
		t.Fatalf("another command's kill ended %d of the background processes", 3-n)
	}
	// At most one reaper is parked: end the second command's, so the
	// first one's has the place once its tree is gone.
	waitSpare(t, e.srv)
	e.srv.spares.mu.Lock()
	e.srv.spares.dropLocked()
	e.srv.spares.mu.Unlock()
	for _, pid := range alive(mark) {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	if left := waitGone(mark, 5*time.Second); len(left) > 0 {
		t.Fatalf("background processes %v still running", left)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		e.srv.spares.mu.Lock()
		parked := e.srv.spares.spare
		e.srv.spares.mu.Unlock()
		if parked != nil && strconv.Itoa(parked.cmd.Process.Pid) == held {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("reaper %s was not parked again once its command's tree was gone", held)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if again := reaperOf(t, c); again != held {
		t.Fatalf("the next command ran under reaper %s, not the freed %s", again, held)
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

// sessionOf returns the session id of the one process in pids.
func sessionOf(t *testing.T, pids []int) string {
	t.Helper()
	if len(pids) != 1 {
		t.Fatalf("want one process, got %v", pids)
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pids[0]) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	// "pid (comm) state ppid pgrp session ..."
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	return f[3]
}

// sleepers lists the pids of "sleep n".
func sleepers(n int) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && string(b) == "sleep\x00"+strconv.Itoa(n)+"\x00" {
			if pid, err := strconv.Atoi(e.Name()); err == nil {
				out = append(out, pid)
			}
		}
	}
	return out
}
