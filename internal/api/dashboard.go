package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"

	"github.com/agentbox/agentbox/api/gen/rest"
	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/dashboard"
	"github.com/agentbox/agentbox/internal/envdclient"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/httperr"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// The dashboard's bridge to a sandbox: its terminal (a WebSocket to a PTY)
// and its files (list, download, upload). Every call is authenticated by
// the API key and scoped to the key's team exactly like the REST API: a
// sandbox of another team is 404, the same as one that does not exist.
// Past that, every envd call goes through the gateway (dataplane.go), whose
// admission and audit it meets like an SDK's.
const (
	// terminalProtocol is the WebSocket subprotocol of the terminal. A
	// browser cannot set headers on a WebSocket, so the key travels as a
	// second offered subprotocol, keyProtocolPrefix+key (a request header,
	// never the URL); the server never echoes it back.
	terminalProtocol  = "agentbox.terminal"
	keyProtocolPrefix = "agentbox.key."
	maxUploadBytes    = 1 << 30
)

func (s *Server) dashboardRoutes(mux *http.ServeMux, auth func(string, http.HandlerFunc)) {
	mux.HandleFunc("GET /dashboard", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, dashboard.Prefix, http.StatusMovedPermanently)
	})
	mux.Handle("GET /dashboard/", dashboard.Handler())
	dash := func(pattern string, h http.HandlerFunc) {
		auth(pattern, func(w http.ResponseWriter, r *http.Request) {
			dashboard.SecurityHeaders(w.Header())
			h(w, r)
		})
	}
	dash("GET /dashboard/api/config", s.dashConfig)
	dash("GET /dashboard/api/sandboxes/{id}/dir", s.dashFile(s.dashList))
	dash("GET /dashboard/api/sandboxes/{id}/files", s.dashFile(s.dashDownload))
	dash("POST /dashboard/api/sandboxes/{id}/files", s.dashFile(s.dashUpload))
	term := s.authenticate(http.HandlerFunc(s.dashTerminal))
	mux.HandleFunc("GET /dashboard/api/sandboxes/{id}/terminal", func(w http.ResponseWriter, r *http.Request) {
		dashboard.SecurityHeaders(w.Header())
		if !sameOrigin(r) {
			httperr.WriteJSON(w, http.StatusForbidden, rest.Error{Code: http.StatusForbidden, Message: "terminal: the Origin header must be this server's own (open the terminal from the dashboard's page)"})
			return
		}
		if key := protocolKey(r); key != "" {
			r.Header.Set("X-API-Key", key)
		}
		term.ServeHTTP(w, r)
	})
}

// dashConfig tells the page where sandbox ports are served: on hosts
// <port>-<id>.<portDomain> of their own, never on the dashboard's origin.
func (s *Server) dashConfig(w http.ResponseWriter, r *http.Request) {
	scheme, domain := "http", "localhost"
	if s.portOrigin != nil {
		scheme, domain = s.portOrigin(r)
	} else if _, port, err := net.SplitHostPort(r.Host); err == nil && port != "" {
		domain += ":" + port
	}
	httperr.WriteJSON(w, http.StatusOK, map[string]string{"portScheme": scheme, "portDomain": domain})
}

// sameOrigin: a WebSocket is not subject to the browser's same-origin rule,
// so a page of another site could otherwise open one with a key it learnt.
func sameOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		return true // not a browser: the key alone decides
	}
	rest, ok := strings.CutPrefix(o, "http://")
	if !ok {
		rest, ok = strings.CutPrefix(o, "https://")
	}
	return ok && strings.EqualFold(rest, r.Host)
}

func protocolKey(r *http.Request) string {
	for _, h := range r.Header.Values("Sec-WebSocket-Protocol") {
		for p := range strings.SplitSeq(h, ",") {
			if k, ok := strings.CutPrefix(strings.TrimSpace(p), keyProtocolPrefix); ok {
				return k
			}
		}
	}
	return ""
}

// dashEnvd is a client of the envd of the calling team's sandbox, through
// the gateway (which wakes the sandbox if it may, as for any client), and
// the gateway's last refusal of its calls.
func (s *Server) dashEnvd(r *http.Request) (*sandbox.Sandbox, *envdclient.Client, *refusal, error) {
	key := keyOf(r.Context())
	sb, err := s.mgr.Get(r.Context(), key.TeamID, sandboxID(r))
	if err != nil {
		return nil, nil, nil, err
	}
	c, refused, err := s.envdThroughGateway(r, sb)
	if err != nil {
		return nil, nil, nil, err
	}
	return sb, c, refused, nil
}

// dashFileHandler serves a file call of the dashboard on path p of the
// calling team's sandbox sb through envd client c; it answers failures
// with fail.
type dashFileHandler func(w http.ResponseWriter, r *http.Request, p string, sb *sandbox.Sandbox, c *envdclient.Client, fail func(error))

// dashFile checks the path of a file call and finds its sandbox for h.
func (s *Server) dashFile(h dashFileHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, err := dashPath(r)
		if err != nil {
			httperr.Write(w, err)
			return
		}
		sb, c, refused, err := s.dashEnvd(r)
		if err != nil {
			httperr.Write(w, err)
			return
		}
		h(w, r, p, sb, c, func(err error) {
			// The gateway's refusal (a bound, a sandbox not running) is
			// the answer, as it is to an SDK; else the call's own error.
			if status, msg := refused.get(); status != 0 {
				httperr.WriteJSON(w, status, rest.Error{Code: status, Message: msg})
				return
			}
			httperr.Write(w, err)
		})
	}
}

func dashPath(r *http.Request) (string, error) {
	p := r.URL.Query().Get("path")
	if p == "" || len(p) > 4096 || strings.ContainsRune(p, 0) {
		return "", invalid("path: give the file's path in the sandbox, e.g. /home/user/a.txt")
	}
	return p, nil
}

func (s *Server) dashList(w http.ResponseWriter, r *http.Request, p string, sb *sandbox.Sandbox, c *envdclient.Client, fail func(error)) {
	entries, err := c.ListDir(r.Context(), p, "")
	if err != nil {
		s.log.Info("dashboard list", "sandbox", sb.ID, "err", err)
		fail(fmt.Errorf("cannot list %q in the sandbox (no such directory, or not readable): %w", p, errdefs.ErrNotFound))
		return
	}
	httperr.WriteJSON(w, http.StatusOK, entries)
}

func (s *Server) dashDownload(w http.ResponseWriter, r *http.Request, p string, sb *sandbox.Sandbox, c *envdclient.Client, fail func(error)) {
	rc, size, err := c.OpenFile(r.Context(), p, "")
	if err != nil {
		s.log.Info("dashboard download", "sandbox", sb.ID, "err", err)
		fail(fmt.Errorf("cannot read %q in the sandbox (no such file, a directory, or not readable): %w", p, errdefs.ErrNotFound))
		return
	}
	defer rc.Close()
	// Always an attachment of opaque bytes: a file a sandbox wrote must
	// never render as a page of the dashboard's origin.
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", "attachment")
	if size >= 0 {
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	}
	if _, err := io.Copy(w, rc); err != nil {
		s.log.Info("dashboard download cut", "sandbox", sb.ID, "err", err)
	}
}

// dashUpload writes the body to p; the gateway audits the write.
func (s *Server) dashUpload(w http.ResponseWriter, r *http.Request, p string, sb *sandbox.Sandbox, c *envdclient.Client, fail func(error)) {
	body := http.MaxBytesReader(w, r.Body, maxUploadBytes)
	if err := c.WriteFileFrom(r.Context(), p, "", body); err != nil {
		s.log.Info("dashboard upload", "sandbox", sb.ID, "err", err)
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			fail(fmt.Errorf("body: the file is over the limit of %d bytes: %w", maxUploadBytes, errdefs.ErrTooLarge))
			return
		}
		fail(fmt.Errorf("cannot write %q in the sandbox (a directory, or not writable): %w", p, errdefs.ErrInvalidArgument))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// record writes ev to the audit log, if the server keeps one.
func (s *Server) record(ctx context.Context, ev audit.Event) {
	if s.mgr == nil {
		return
	}
	if al := s.mgr.Audit(); al != nil {
		al.Record(ctx, ev)
	}
}

// resize is the terminal's one control message (text frames); binary
// frames are keystrokes.
type resize struct {
	Cols uint16 `json:"cols"`
	Rows uint16 `json:"rows"`
}

func (s *Server) dashTerminal(w http.ResponseWriter, r *http.Request) {
	sb, envd, refused, err := s.dashEnvd(r)
	if err != nil {
		httperr.Write(w, err)
		return
	}
	// Origin was checked against Host already; the library checks again.
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{terminalProtocol}})
	if err != nil {
		return
	}
	defer c.CloseNow()
	c.SetReadLimit(1 << 20) // a large paste is one message
	if c.Subprotocol() != terminalProtocol {
		c.Close(websocket.StatusPolicyViolation, "offer the "+terminalProtocol+" subprotocol")
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	size := resize{Cols: 80, Rows: 24}
	if v := r.URL.Query(); v.Get("cols") != "" {
		fmt.Sscan(v.Get("cols"), &size.Cols)
		fmt.Sscan(v.Get("rows"), &size.Rows)
	}
	// The gateway admits and audits the shell as it does an SDK's PTY.
	pty, err := envd.StartPTY(ctx, "", clampSize(size.Cols, 80), clampSize(size.Rows, 24))
	if err != nil {
		s.log.Info("dashboard terminal", "sandbox", sb.ID, "err", err)
		why := err.Error()
		if _, msg := refused.get(); msg != "" {
			why = msg
		}
		// The whole reason on the screen (a close reason holds 123 bytes).
		_ = c.Write(ctx, websocket.MessageBinary, []byte("no shell: "+why+"\r\n"))
		c.Close(websocket.StatusTryAgainLater, closeReason("no shell: "+why))
		return
	}
	defer func() {
		kctx, kcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer kcancel()
		_ = pty.Close(kctx)
	}()
	go func() {
		defer cancel()
		for {
			typ, msg, err := c.Read(ctx)
			if err != nil {
				return
			}
			if typ == websocket.MessageBinary {
				if pty.Write(ctx, msg) != nil {
					return
				}
				continue
			}
			var rs resize
			if json.Unmarshal(msg, &rs) == nil && rs.Cols > 0 && rs.Rows > 0 {
				_ = pty.Resize(ctx, clampSize(rs.Cols, 80), clampSize(rs.Rows, 24))
			}
		}
	}()
	for {
		out, err := pty.Read()
		if err != nil {
			if errors.Is(err, envdclient.ErrExited) {
				c.Close(websocket.StatusNormalClosure, "the shell exited")
			}
			return
		}
		if err := c.Write(ctx, websocket.MessageBinary, out); err != nil {
			return
		}
	}
}

func clampSize(v, def uint16) uint16 {
	if v == 0 || v > 1000 {
		return def
	}
	return v
}

// closeReason fits a WebSocket close reason (at most 123 bytes).
func closeReason(s string) string {
	if len(s) <= 123 {
		return s
	}
	return s[:120] + "..."
}
