package gateway

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/httperr"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// TunnelUpgrade is the Upgrade token of a raw TCP tunnel.
const TunnelUpgrade = "agentbox-tcp"

// Tunnel turns r into a raw TCP stream to port inside sandbox sb, for
// `agentbox port-forward`. The API has already authenticated the caller as
// sb's team; that key also stands in for the traffic access token (the
// same key reads it from connect). Everything else is the gateway's
// admission: the sandbox is woken like any traffic (thawed, or resumed with
// autoResume) and counts as active while the tunnel is open, and the tunnel
// is audited when opened, refused and closed. envd's port is refused: a
// raw stream would pass the route filter that keeps /init and the other
// internal routes for the server; envd is reached through the data plane.
func (g *Gateway) Tunnel(w http.ResponseWriter, r *http.Request, sb *sandbox.Sandbox, port int, apiKeyID string) {
	base := audit.Event{SandboxID: sb.ID, TeamID: sb.TeamID, APIKeyID: apiKeyID, Kind: audit.KindIngress, Action: "tunnel",
		Fields: map[string]any{"port": port, "client": r.RemoteAddr}}
	if port == sandbox.EnvdPort {
		msg := fmt.Sprintf("port %d is envd's and is not tunnelled: reach envd through the data plane (E2b-Sandbox-Port: %d), which keeps its internal routes for the server", port, port)
		g.record(r.Context(), base, audit.Denied, msg)
		httperr.WriteJSON(w, http.StatusForbidden, map[string]any{"sandboxId": sb.ID, "port": port, "code": http.StatusForbidden, "message": msg})
		return
	}
	live, alive, done, ok := g.wake(r.Context(), sb.ID, nil)
	if !ok {
		notFound(w, sb.ID)
		return
	}
	defer done()
	release, ok := g.hold(w, r, sb.ID)
	if !ok {
		g.record(r.Context(), base, audit.Denied, "gateway connection limit")
		return
	}
	defer release()
	d := net.Dialer{Timeout: 5 * time.Second}
	up, err := d.DialContext(r.Context(), "tcp4", net.JoinHostPort(live.IP.String(), strconv.Itoa(port)))
	if err != nil {
		httperr.WriteJSON(w, http.StatusBadGateway, map[string]any{"sandboxId": sb.ID, "message": "The sandbox is running but port is not open", "port": port, "code": http.StatusBadGateway})
		return
	}
	defer up.Close()
	c, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		httperr.WriteJSON(w, http.StatusInternalServerError, map[string]any{"code": http.StatusInternalServerError, "message": "tunnel: " + err.Error()})
		return
	}
	defer c.Close()
	// The tunnel ends with the sandbox (or the server's shutdown).
	stop := context.AfterFunc(alive, func() { c.Close(); up.Close() })
	defer stop()
	_ = c.SetDeadline(time.Time{})
	if _, err := io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: "+TunnelUpgrade+"\r\nConnection: Upgrade\r\n\r\n"); err != nil {
		return
	}
	// The hijacked connection outlives r's context; the audit must not.
	ctx := context.WithoutCancel(r.Context())
	g.record(ctx, base, audit.Allowed, "")
	t0 := time.Now()
	var in, out atomic.Int64
	copied := make(chan struct{})
	go func() {
		// Bytes the client sent after the request are in brw's buffer.
		n, _ := io.Copy(up, brw.Reader)
		in.Store(n)
		if cw, ok := up.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		close(copied)
	}()
	n, _ := io.Copy(c, up)
	out.Store(n)
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	<-copied
	end := base
	end.Action = "tunnel-closed"
	end.Fields = map[string]any{"port": port, "client": r.RemoteAddr, "bytesIn": in.Load(), "bytesOut": out.Load(), "seconds": time.Since(t0).Round(time.Millisecond).Seconds()}
	g.record(ctx, end, audit.Info, "")
}

// record appends e to the audit log, if there is one.
func (g *Gateway) record(ctx context.Context, e audit.Event, decision, reason string) {
	if g.tap == nil {
		return
	}
	e.Decision, e.Reason = decision, reason
	g.tap.log.Record(ctx, e)
}
