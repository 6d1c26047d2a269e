package envd

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/agentbox/agentbox/api/gen/process"
)

// escapees is a command that leaves processes behind the way a command
// escapes its process group: a setsid child, a double-forked daemon (its
// parent exits, so it is re-parented), and a setsid'd double fork. Each
// sleeps for a duration unique to the test, to be found in /proc.
func escapees(mark int) string {
	return fmt.Sprintf(`setsid sleep %d & ( sleep %d & ) ; ( setsid sh -c 'sleep %d & exit' & ) ;`, mark, mark+1, mark+2)
}

// alive lists the pids of the escapees of mark still running.
func alive(mark int) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		for m := mark; m < mark+3; m++ {
			if bytes.Equal(b, []byte("sleep\x00"+strconv.Itoa(m)+"\x00")) {
				if pp, ok := parentOf(pid); ok && pp >= 0 {
					out = append(out, pid)
				}
			}
		}
	}
	return out
}

func waitGone(mark int, within time.Duration) []int {
	deadline := time.Now().Add(within)
	for {
		left := alive(mark)
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestLifetimeCapEndsTheWholeTree attacks the command lifetime cap and the
// explicit kill with processes that leave the command's process group.
// Everything the command started must be gone after the cap (also after the
// command itself returned: a background server keeps running until then,
// as in E2B) and after SIGKILL. The control runs commands without the
// reaper and shows the escapees surviving the old group kill.
func TestLifetimeCapEndsTheWholeTree(t *testing.T) {
	mark := 7000 + os.Getpid()%1000*10
	e := newTestEnv(t, "")
	if resp := e.do("POST", "/init", jsonBody(map[string]any{"maxCommandSeconds": 3}), nil); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("init: %d", resp.StatusCode)
	}
	c := e.processClient(nil, connect.WithProtoJSON())
	t.Cleanup(func() {
		for m := mark; m < mark+40; m += 3 {
			for _, pid := range alive(m) {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})

	t.Run("cap while the command runs", func(t *testing.T) {
		m := mark
		r := run(t, c, startReq(escapees(m)+" sleep 600"))
		if connect.CodeOf(r.err) != connect.CodeDeadlineExceeded {
			t.Fatalf("err %v, want the cap's deadline_exceeded", r.err)
		}
		if left := waitGone(m, 4*time.Second); len(left) > 0 {
			t.Fatalf("escapees %v outlived the cap", left)
		}
	})

	t.Run("cap after the command returned", func(t *testing.T) {
		m := mark + 3
		t0 := time.Now()
		// Like `nohup server > log &`: the pipes do not wait for them.
		r := run(t, c, startReq("{ "+escapees(m)+" } >/dev/null 2>&1; echo done"))
		if r.err != nil || r.end.GetExitCode() != 0 {
			t.Fatalf("command: end %v err %v", r.end, r.err)
		}
		time.Sleep(300 * time.Millisecond)
		if n := len(alive(m)); n != 3 || time.Since(t0) > 1500*time.Millisecond {
			t.Fatalf("%d of 3 background processes running after the command returned; they must run until the cap", n)
		}
		if left := waitGone(m, 5*time.Second); len(left) > 0 {
			t.Fatalf("escapees %v outlived the cap", left)
		}
	})

	t.Run("kill", func(t *testing.T) {
		m := mark + 6
		s, err := c.Start(ctxT(t), startReq(escapees(m)+" echo up; sleep 600"))
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
		time.Sleep(200 * time.Millisecond)
		if _, err := c.SendSignal(ctxT(t), connect.NewRequest(&process.SendSignalRequest{
			Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}, Signal: process.Signal_SIGNAL_SIGKILL,
		})); err != nil {
			t.Fatal(err)
		}
		if left := waitGone(m, 3*time.Second); len(left) > 0 {
			t.Fatalf("escapees %v outlived SIGKILL", left)
		}
	})

	t.Run("control: no reaper", func(t *testing.T) {
		m := mark + 9
		e.srv.reaper = ""
		defer func() { e.srv.reaper = testReaper }()
		r := run(t, c, startReq(escapees(m)+" sleep 600"))
		if connect.CodeOf(r.err) != connect.CodeDeadlineExceeded {
			t.Fatalf("err %v", r.err)
		}
		if left := waitGone(m, time.Second); len(left) == 0 {
			t.Fatal("without the reaper the escapees died too: this test cannot tell the defence from its absence")
		}
	})
}

func TestStatusString(t *testing.T) {
	for _, tc := range []struct {
		ws   syscall.WaitStatus
		want string
		code int
	}{
		{0, "exit status 0", 0},
		{1 << 8, "exit status 1", 1},
		{syscall.WaitStatus(syscall.SIGKILL), "signal: killed", -1},
		{syscall.WaitStatus(syscall.SIGSEGV) | 0x80, "signal: segmentation fault (core dumped)", -1},
	} {
		if got := statusString(tc.ws); got != tc.want || exitCode(tc.ws) != tc.code {
			t.Errorf("%#x: %q %d, want %q %d", uint32(tc.ws), got, exitCode(tc.ws), tc.want, tc.code)
		}
	}
}

// TestCommandsYieldToEnvdOnOOM: commands (on a reaper of their own and on
// spare reapers) run with a higher oom_score_adj than envd's, so the OOM
// killer of a full sandbox takes them before envd, the sandbox's init.
func TestCommandsYieldToEnvdOnOOM(t *testing.T) {
	b, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		t.Fatal(err)
	}
	own, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	want := strconv.Itoa(min(own+oomMargin, 1000))
	e := newTestEnv(t, "")
	c := e.processClient(nil, connect.WithProtoJSON())
	// Commands in succession run on spare reapers.
	for i := range 4 {
		r := run(t, c, startReq("cat /proc/self/oom_score_adj; sleep 0.2 & cat /proc/$!/oom_score_adj"))
		if r.err != nil {
			t.Fatal(r.err)
		}
		if got := strings.Fields(r.stdout.String()); len(got) != 2 || got[0] != want || got[1] != want {
			t.Errorf("command %d: oom_score_adj %q of the command and its child, want %s (envd's %d + %d)", i, got, want, own, oomMargin)
		}
	}
}
