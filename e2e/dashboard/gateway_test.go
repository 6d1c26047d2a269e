package dashboard_test

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/agentbox/agentbox/e2e/harness"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// TestTerminalThroughGateway: the dashboard's terminal is a PTY through the
// gateway like an SDK's: audited the same way, and admitted under the same
// bounds (a sandbox holding --gateway-max-per-sandbox streams refuses it).
func TestTerminalThroughGateway(t *testing.T) {
	srv := harness.Start(t, harness.Name("dashgw"), harness.Args("--gateway-max-per-sandbox", "2"))
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	c := agentbox.New(agentbox.WithAPIURL(srv.URL), agentbox.WithSandboxURL(srv.URL), agentbox.WithAPIKey(srv.APIKey))
	sbx, err := c.Create(ctx, agentbox.CreateOptions{Template: "base", Timeout: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer sbx.Kill(context.Background())

	// The dashboard's terminal runs a shell; the gateway audits its start.
	ws, err := dialTerminal(ctx, srv, sbx.ID)
	if err != nil {
		t.Fatalf("open the dashboard terminal: %v", err)
	}
	if err := ws.Write(ctx, websocket.MessageBinary, []byte("echo dash-$((6*7))\n")); err != nil {
		t.Fatal(err)
	}
	if err := readUntil(ctx, ws, "dash-42"); err != nil {
		t.Fatalf("dashboard terminal: %v", err)
	}
	ws.Close(websocket.StatusNormalClosure, "")

	// The same through the SDK. The terminal's slot is given back once
	// the gateway sees its connection end, a moment after our close: wait
	// for that, not for a fixed time.
	pty, err := sbx.PTY.Create(ctx, agentbox.PTYOptions{})
	for deadline := time.Now().Add(30 * time.Second); err != nil && strings.Contains(err.Error(), "503") && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		pty, err = sbx.PTY.Create(ctx, agentbox.PTYOptions{})
	}
	if err != nil {
		t.Fatal(err)
	}
	_ = pty.Kill(ctx)

	var starts []agentbox.LogEntry
	for deadline := time.Now().Add(time.Minute); len(starts) < 2; time.Sleep(200 * time.Millisecond) {
		logs, err := c.Logs(ctx, sbx.ID, agentbox.LogsOptions{Kinds: []string{"process"}})
		if err != nil {
			t.Fatal(err)
		}
		starts = starts[:0]
		for _, e := range logs {
			if e.Fields["action"] == "start" && e.Fields["pty"] == "true" {
				starts = append(starts, e)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("PTY starts in the audit log: %+v; want the dashboard's and the SDK's", starts)
		}
	}
	dash, sdk := auditShape(starts[0]), auditShape(starts[1])
	if !maps.Equal(dash, sdk) {
		t.Errorf("the dashboard terminal's audit event %v differs from an SDK PTY's %v", dash, sdk)
	}

	// A file written from the dashboard's file browser is audited by the
	// gateway, as an SDK's write is.
	st, b, err := srv.DoHeader(ctx, srv.APIKey, http.MethodPost, "/dashboard/api/sandboxes/"+sbx.ID+"/files?path=/tmp/dash-gw.txt", "hello", nil)
	if err != nil || st != http.StatusNoContent {
		t.Fatalf("upload from the dashboard: %d %s %v", st, b, err)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		logs, err := c.Logs(ctx, sbx.ID, agentbox.LogsOptions{Kinds: []string{"file"}})
		if err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(logs, func(e agentbox.LogEntry) bool {
			return e.Fields["action"] == "write" && e.Fields["path"] == "/tmp/dash-gw.txt"
		}) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no file write of /tmp/dash-gw.txt in the audit log: %+v", logs)
		}
	}

	// Two streams held open fill the sandbox's bound: the dashboard's
	// terminal is refused like a third SDK request.
	holdCtx, stop := context.WithCancel(ctx)
	defer stop()
	for i := range 2 {
		if _, err := sbx.Commands.Start(holdCtx, "sleep 300"); err != nil {
			t.Fatalf("stream %d within the bound: %v", i, err)
		}
	}
	ws, err = dialTerminal(ctx, srv, sbx.ID)
	if err != nil {
		t.Fatalf("open the dashboard terminal: %v", err)
	}
	defer ws.CloseNow()
	err = readUntil(ctx, ws, "--gateway-max-per-sandbox")
	if err != nil {
		t.Fatalf("dashboard terminal at the sandbox's bound: %v; want a refusal naming --gateway-max-per-sandbox", err)
	}
	_, _, err = ws.Read(ctx)
	if websocket.CloseStatus(err) != websocket.StatusTryAgainLater {
		t.Fatalf("dashboard terminal at the sandbox's bound: %v; want it closed (try again later)", err)
	}
}

// auditShape is what an event says of the process, without what differs
// between any two starts.
func auditShape(e agentbox.LogEntry) map[string]string {
	out := map[string]string{}
	for _, k := range []string{"kind", "action", "decision", "cmd", "args", "pty", "user"} {
		out[k] = e.Fields[k]
	}
	return out
}

func dialTerminal(ctx context.Context, srv *harness.Server, id string) (*websocket.Conn, error) {
	url := "ws" + strings.TrimPrefix(srv.URL, "http") + "/dashboard/api/sandboxes/" + id + "/terminal?cols=80&rows=24"
	ws, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{
		Subprotocols: []string{"agentbox.terminal", "agentbox.key." + srv.APIKey},
		HTTPHeader:   http.Header{"Origin": {srv.URL}},
	})
	if err != nil {
		if resp != nil {
			return nil, fmt.Errorf("%w (HTTP %d)", err, resp.StatusCode)
		}
		return nil, err
	}
	return ws, nil
}

func readUntil(ctx context.Context, ws *websocket.Conn, want string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var seen strings.Builder
	for !strings.Contains(seen.String(), want) {
		_, b, err := ws.Read(ctx)
		if err != nil {
			return fmt.Errorf("%w; output so far %q", err, seen.String())
		}
		seen.Write(b)
	}
	return nil
}
