package envd

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/agentbox/agentbox/api/gen/process"
)

func TestProcessLifetime(t *testing.T) {
	for _, tc := range []struct {
		name       string
		limit      time.Duration
		reqTimeout time.Duration // 0 = no deadline
		wantCapped time.Duration
		wantNone   bool
	}{
		{name: "no cap, no deadline", wantNone: true},
		{name: "no cap, request deadline", reqTimeout: time.Hour},
		{name: "cap, no deadline", limit: time.Minute, wantCapped: time.Minute},
		{name: "cap shorter than request", limit: time.Minute, reqTimeout: time.Hour, wantCapped: time.Minute},
		{name: "request shorter than cap", limit: time.Hour, reqTimeout: time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewServer(Options{})
			s.maxCommand = tc.limit
			ctx := context.Background()
			if tc.reqTimeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.reqTimeout)
				defer cancel()
			}
			life, cancel, capped := s.processLifetime(ctx)
			defer cancel()
			if capped != tc.wantCapped {
				t.Errorf("capped = %s, want %s", capped, tc.wantCapped)
			}
			_, has := life.Deadline()
			if has == tc.wantNone {
				t.Errorf("deadline set = %v", has)
			}
		})
	}
}

// A process started without a timeout is killed at the cap set by /init,
// and both the end event and the stream's error say so.
func TestCommandLifetimeCapKills(t *testing.T) {
	e := newTestEnv(t, "")
	if resp := e.do("POST", "/init", jsonBody(map[string]any{"maxCommandSeconds": 1}), nil); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("init: %d", resp.StatusCode)
	}
	c := e.processClient(nil, connect.WithProtoJSON())
	s, err := c.Start(context.Background(), startReq("echo started; sleep 600"))
	if err != nil {
		t.Fatal(err)
	}
	r := collect[*process.StartResponse](s)
	if r.pid == 0 || connect.CodeOf(r.err) != connect.CodeDeadlineExceeded || !strings.Contains(r.err.Error(), "maximum command lifetime") {
		t.Fatalf("pid %d err %v", r.pid, r.err)
	}
	waitExited(t, e, r.pid)
	p, err := e.srv.procs.get(&process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: r.pid}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(p.end.GetError(), "maxCommandSeconds=1") {
		t.Errorf("end error %q does not name the cap", p.end.GetError())
	}
}
