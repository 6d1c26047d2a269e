package envd

import (
	"bytes"
	"context"
	"crypto/sha256"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/agentbox/agentbox/api/gen/process"
	"github.com/agentbox/agentbox/api/gen/process/processconnect"
)

// result collects one process stream.
type result struct {
	pid            uint32
	stdout, stderr bytes.Buffer
	pty            bytes.Buffer
	end            *process.ProcessEvent_EndEvent
	keepalives     int
	first          string
	err            error
}

func collect[T interface{ GetEvent() *process.ProcessEvent }](s interface {
	Receive() bool
	Msg() T
	Err() error
}) *result {
	r := &result{}
	for s.Receive() {
		ev := s.Msg().GetEvent()
		if r.first == "" {
			switch ev.GetEvent().(type) {
			case *process.ProcessEvent_Start:
				r.first = "start"
			default:
				r.first = "other"
			}
		}
		switch v := ev.GetEvent().(type) {
		case *process.ProcessEvent_Start:
			r.pid = v.Start.GetPid()
		case *process.ProcessEvent_Data:
			r.stdout.Write(v.Data.GetStdout())
			r.stderr.Write(v.Data.GetStderr())
			r.pty.Write(v.Data.GetPty())
		case *process.ProcessEvent_End:
			r.end = v.End
		case *process.ProcessEvent_Keepalive:
			r.keepalives++
		}
	}
	r.err = s.Err()
	return r
}

func startReq(cmd string, mod ...func(*process.StartRequest)) *connect.Request[process.StartRequest] {
	no := false
	m := &process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", cmd}}, Stdin: &no}
	for _, f := range mod {
		f(m)
	}
	return connect.NewRequest(m)
}

func run(t *testing.T, c processconnect.ProcessClient, req *connect.Request[process.StartRequest]) *result {
	t.Helper()
	s, err := c.Start(ctxT(t), req)
	if err != nil {
		t.Fatal(err)
	}
	return collect[*process.StartResponse](s)
}

func TestStart(t *testing.T) {
	e := newTestEnv(t, testToken)
	for _, codec := range codecs {
		t.Run(codec.name, func(t *testing.T) {
			c := e.processClient(clientHeaders("", testToken), codec.opts...)
			tests := []struct {
				name       string
				req        *connect.Request[process.StartRequest]
				user       string
				wantOut    string
				wantErr    string
				wantCode   int32
				wantStatus string
			}{
				{name: "stdout and exit code", req: startReq("echo hi; echo err >&2; exit 3"), wantOut: "hi\n", wantErr: "err\n", wantCode: 3, wantStatus: "exit status 3"},
				{name: "default user, groups and env", req: startReq(`echo $(id -u) $(id -G) $HOME $USER $LOGNAME $SANDBOX_VAR $REQ`, func(r *process.StartRequest) { r.Process.Envs = map[string]string{"REQ": "rv"} }),
					wantOut: "12345 12345 23456 " + e.home + " tester tester sv rv\n", wantStatus: "exit status 0"},
				{name: "default workdir", req: startReq("pwd"), wantOut: e.home + "\n", wantStatus: "exit status 0"},
				{name: "relative cwd", req: startReq("pwd", func(r *process.StartRequest) { c := "."; r.Process.Cwd = &c }), wantOut: e.home + "\n", wantStatus: "exit status 0"},
				{name: "absolute cwd", req: startReq("pwd", func(r *process.StartRequest) { c := "/tmp"; r.Process.Cwd = &c }), wantOut: "/tmp\n", wantStatus: "exit status 0"},
				{name: "root via basic auth", req: withHeader(startReq("id -u; echo $HOME"), "Authorization", "Basic cm9vdDo="), wantOut: "0\n" + e.rootHome + "\n", wantStatus: "exit status 0"},
				{name: "killed by signal", req: startReq("kill -9 $$"), wantCode: -1, wantStatus: "signal: killed"},
			}
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					r := run(t, c, tt.req)
					if r.err != nil {
						t.Fatal(r.err)
					}
					if r.first != "start" || r.pid == 0 {
						t.Errorf("first event %q pid %d, want start with pid", r.first, r.pid)
					}
					if r.stdout.String() != tt.wantOut || r.stderr.String() != tt.wantErr {
						t.Errorf("stdout %q stderr %q, want %q %q", r.stdout.String(), r.stderr.String(), tt.wantOut, tt.wantErr)
					}
					if r.end == nil || r.end.ExitCode != tt.wantCode || r.end.Status != tt.wantStatus {
						t.Errorf("end %v, want code %d status %q", r.end, tt.wantCode, tt.wantStatus)
					}
				})
			}
		})
	}
}

func withHeader[T any](r *connect.Request[T], k, v string) *connect.Request[T] {
	r.Header().Set(k, v)
	return r
}

func TestStartErrors(t *testing.T) {
	e := newTestEnv(t, testToken)
	c := e.processClient(clientHeaders("", testToken))
	cases := []struct {
		name string
		req  *connect.Request[process.StartRequest]
		code connect.Code
		msg  string
	}{
		{"missing cwd", startReq("true", func(r *process.StartRequest) { c := "/nope"; r.Process.Cwd = &c }), connect.CodeInvalidArgument, "cwd '/nope' does not exist"},
		{"unknown user", withHeader(startReq("true"), "Authorization", "Basic Z2hvc3Q6"), connect.CodeUnauthenticated, ""},
		{"no command", connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{}}), connect.CodeInvalidArgument, ""},
	}
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			r := run(t, c, tt.req)
			if connect.CodeOf(r.err) != tt.code || !strings.Contains(r.err.Error(), tt.msg) {
				t.Fatalf("err %v, want %v containing %q", r.err, tt.code, tt.msg)
			}
		})
	}
	// Without the token nothing runs.
	r := run(t, e.processClient(nil), startReq("true"))
	if connect.CodeOf(r.err) != connect.CodeUnauthenticated {
		t.Fatalf("no token: %v", r.err)
	}
}

func TestLargeOutputIntact(t *testing.T) {
	e := newTestEnv(t, "")
	for _, codec := range codecs {
		t.Run(codec.name, func(t *testing.T) {
			c := e.processClient(nil, codec.opts...)
			// 5 MiB of numbered lines: order and completeness are both visible.
			r := run(t, c, startReq("seq 1 1000000 | head -c 5242880"))
			if r.err != nil {
				t.Fatal(r.err)
			}
			want := seqBytes(1000000)[:5242880]
			if r.stdout.Len() != len(want) || sha256.Sum256(r.stdout.Bytes()) != sha256.Sum256(want) {
				t.Fatalf("got %d bytes, want %d identical bytes", r.stdout.Len(), len(want))
			}
		})
	}
}

func seqBytes(n int) []byte {
	var b bytes.Buffer
	for i := 1; i <= n; i++ {
		b.WriteString(strconv.Itoa(i))
		b.WriteByte('\n')
	}
	return b.Bytes()
}

func TestStdinAndCloseStdin(t *testing.T) {
	e := newTestEnv(t, "")
	c := e.processClient(nil)
	yes := true
	s, err := c.Start(ctxT(t), startReq("cat; echo done", func(r *process.StartRequest) { r.Stdin = &yes; r.Tag = ptr("catter") }))
	if err != nil {
		t.Fatal(err)
	}
	if !s.Receive() {
		t.Fatal(s.Err())
	}
	pid := s.Msg().GetEvent().GetStart().GetPid()
	sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Tag{Tag: "catter"}}
	if _, err := c.SendInput(ctxT(t), connect.NewRequest(&process.SendInputRequest{Process: sel, Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("hello\n")}}})); err != nil {
		t.Fatal(err)
	}
	list, err := c.List(ctxT(t), connect.NewRequest(&process.ListRequest{}))
	if err != nil || len(list.Msg.Processes) != 1 || list.Msg.Processes[0].Pid != pid || list.Msg.Processes[0].GetTag() != "catter" {
		t.Fatalf("list %v %v", list, err)
	}
	if _, err := c.CloseStdin(ctxT(t), connect.NewRequest(&process.CloseStdinRequest{Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}})); err != nil {
		t.Fatal(err)
	}
	r := collect[*process.StartResponse](s)
	if r.stdout.String() != "hello\ndone\n" || r.end.GetExitCode() != 0 {
		t.Fatalf("stdout %q end %v err %v", r.stdout.String(), r.end, r.err)
	}
	// Stdin false means /dev/null: cat ends at once.
	r = run(t, c, startReq("cat; echo eof"))
	if r.stdout.String() != "eof\n" {
		t.Fatalf("stdin false: %q", r.stdout.String())
	}
}

func ptr[T any](v T) *T { return &v }

func TestPTY(t *testing.T) {
	e := newTestEnv(t, "")
	c := e.processClient(nil, connect.WithProtoJSON())
	s, err := c.Start(ctxT(t), connect.NewRequest(&process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"--norc", "--noprofile", "-i"}, Envs: map[string]string{"PS1": "$ ", "TERM": "xterm"}},
		Pty:     &process.PTY{Size: &process.PTY_Size{Cols: 80, Rows: 24}},
	}))
	if err != nil {
		t.Fatal(err)
	}
	if !s.Receive() {
		t.Fatal(s.Err())
	}
	sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: s.Msg().GetEvent().GetStart().GetPid()}}
	if _, err := c.Update(ctxT(t), connect.NewRequest(&process.UpdateRequest{Process: sel, Pty: &process.PTY{Size: &process.PTY_Size{Cols: 123, Rows: 45}}})); err != nil {
		t.Fatal(err)
	}
	send := func(b string) {
		if _, err := c.SendInput(ctxT(t), connect.NewRequest(&process.SendInputRequest{Process: sel, Input: &process.ProcessInput{Input: &process.ProcessInput_Pty{Pty: []byte(b)}}})); err != nil {
			t.Fatal(err)
		}
	}
	send("stty size; tty; exit 7\n")
	r := collect[*process.StartResponse](s)
	out := r.pty.String()
	if !strings.Contains(out, "45 123") || !strings.Contains(out, "/dev/pts/") || r.end.GetExitCode() != 7 {
		t.Fatalf("pty output %q end %v err %v", out, r.end, r.err)
	}
	if _, err := c.CloseStdin(ctxT(t), connect.NewRequest(&process.CloseStdinRequest{Process: sel})); connect.CodeOf(err) != connect.CodeInvalidArgument && connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("close stdin of pty: %v", err)
	}
}

func TestSignalConnectAndFanOut(t *testing.T) {
	e := newTestEnv(t, "")
	for _, codec := range codecs {
		t.Run(codec.name, func(t *testing.T) {
			c := e.processClient(nil, codec.opts...)
			s, err := c.Start(ctxT(t), startReq("echo ready; while sleep 0.05; do echo tick; done"))
			if err != nil {
				t.Fatal(err)
			}
			if !s.Receive() {
				t.Fatal(s.Err())
			}
			pid := s.Msg().GetEvent().GetStart().GetPid()
			sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}

			// A second stream attaches to the running process.
			cs, err := c.Connect(ctxT(t), connect.NewRequest(&process.ConnectRequest{Process: sel}))
			if err != nil {
				t.Fatal(err)
			}
			// Both streams see output before the kill.
			waitFor(t, s, "tick")
			waitFor(t, cs, "tick")

			if _, err := c.SendSignal(ctxT(t), connect.NewRequest(&process.SendSignalRequest{Process: sel, Signal: process.Signal_SIGNAL_SIGKILL})); err != nil {
				t.Fatal(err)
			}
			r1 := collect[*process.StartResponse](s)
			r2 := collect[*process.ConnectResponse](cs)
			for _, r := range []*result{r1, r2} {
				if r.end == nil || r.end.ExitCode != -1 || r.end.Status != "signal: killed" {
					t.Fatalf("end %v err %v", r.end, r.err)
				}
			}
			// Connect right after the exit still gets start and end.
			r3 := collect[*process.ConnectResponse](must(c.Connect(ctxT(t), connect.NewRequest(&process.ConnectRequest{Process: sel}))))
			if r3.first != "start" || r3.end == nil || r3.end.Status != "signal: killed" {
				t.Fatalf("connect after exit: %+v", r3)
			}
			// Signals to exited or unknown processes are not_found.
			_, err = c.SendSignal(ctxT(t), connect.NewRequest(&process.SendSignalRequest{Process: sel, Signal: process.Signal_SIGNAL_SIGTERM}))
			if connect.CodeOf(err) != connect.CodeNotFound {
				t.Fatalf("signal exited: %v", err)
			}
			_, err = c.Connect(ctxT(t), connect.NewRequest(&process.ConnectRequest{Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: 999999}}}))
			if err == nil {
				r := collect[*process.ConnectResponse](must(c.Connect(ctxT(t), connect.NewRequest(&process.ConnectRequest{Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: 999999}}}))))
				err = r.err
			}
			if connect.CodeOf(err) != connect.CodeNotFound {
				t.Fatalf("connect unknown: %v", err)
			}
		})
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// waitFor reads events until stdout contains want.
func waitFor[T interface{ GetEvent() *process.ProcessEvent }](t *testing.T, s interface {
	Receive() bool
	Msg() T
	Err() error
}, want string) {
	t.Helper()
	var out bytes.Buffer
	for s.Receive() {
		out.Write(s.Msg().GetEvent().GetData().GetStdout())
		if strings.Contains(out.String(), want) {
			return
		}
	}
	t.Fatalf("stream ended before %q: %v", want, s.Err())
}

func TestTimeoutKillsAndDisconnectDoesNot(t *testing.T) {
	e := newTestEnv(t, "")
	c := e.processClient(nil, connect.WithProtoJSON())

	// The request's deadline is the process's lifetime.
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	s, err := c.Start(ctx, startReq("echo started; sleep 600"))
	if err != nil {
		t.Fatal(err)
	}
	r := collect[*process.StartResponse](s)
	if r.pid == 0 || connect.CodeOf(r.err) != connect.CodeDeadlineExceeded {
		t.Fatalf("pid %d err %v", r.pid, r.err)
	}
	waitExited(t, e, r.pid)

	// A client that goes away leaves the process running.
	ctx2, cancel2 := context.WithCancel(context.Background())
	s, err = c.Start(ctx2, startReq("sleep 600"))
	if err != nil {
		t.Fatal(err)
	}
	if !s.Receive() {
		t.Fatal(s.Err())
	}
	pid := s.Msg().GetEvent().GetStart().GetPid()
	cancel2()
	time.Sleep(300 * time.Millisecond) // let the server notice the disconnect
	p, err := e.srv.procs.get(&process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}})
	if err != nil || p.isDone() {
		t.Fatalf("process gone after disconnect: %v", err)
	}
	if err := p.signal(9); err != nil {
		t.Fatal(err)
	}
	<-p.done
}

func waitExited(t *testing.T, e *testEnv, pid uint32) {
	t.Helper()
	p, err := e.srv.procs.get(&process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Fatal("process not killed at its deadline")
	}
	if p.end.GetError() == "" {
		t.Errorf("end after timeout has no error: %v", p.end)
	}
}

func TestKeepalive(t *testing.T) {
	e := newTestEnv(t, "")
	c := e.processClient(map[string]string{"Keepalive-Ping-Interval": "1"})
	r := run(t, c, startReq("sleep 2.5; echo x"))
	if r.keepalives < 1 || r.stdout.String() != "x\n" {
		t.Fatalf("keepalives %d stdout %q err %v", r.keepalives, r.stdout.String(), r.err)
	}
}
