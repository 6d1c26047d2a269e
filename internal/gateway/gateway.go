// Package gateway is agentbox's data plane: it routes a request to a port
// inside a sandbox (envd, the code interpreter, or any user server) and
// streams it through unbuffered, WebSockets included. Everything that is not
// for a sandbox goes to the control-plane API on the same listener.
package gateway

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"time"

	"github.com/agentbox/agentbox/internal/authlimit"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/httperr"
	"github.com/agentbox/agentbox/internal/porthost"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// Resolver finds running sandboxes.
type Resolver interface {
	Lookup(id string) (*sandbox.Sandbox, bool)
	Running() []*sandbox.Sandbox
	Token(id string) string
	TrafficToken(id string) string
}

// Gateway routes data-plane requests.
type Gateway struct {
	res     Resolver
	log     *slog.Logger
	proxy   *httputil.ReverseProxy
	tap     *auditTap // nil: no audit log
	opts    Options
	guesses *authlimit.Limiter
	conns   conns                           // conns.go
	counter func(target string, status int) // SetRequestCounter; nil counts nothing
	// drainCtx ends at Drain (drain.go): every proxied request ends with it.
	drainCtx context.Context
	drain    context.CancelFunc
}

// SetRequestCounter has every answered request counted by target ("envd",
// "interpreter" or "port") and status. Call before serving.
func (g *Gateway) SetRequestCounter(f func(target string, status int)) { g.counter = f }

func (g *Gateway) count(port, status int) {
	if g.counter == nil {
		return
	}
	target := "port"
	switch port {
	case sandbox.EnvdPort:
		target = "envd"
	case InterpreterPort:
		target = "interpreter"
	}
	g.counter(target, status)
}

// InterpreterPort is the code interpreter's port in interpreter templates;
// like envd's, it answers a wrong access token with 401.
const InterpreterPort = 49999

type targetKey struct{}

type target struct {
	id   string
	port int
	addr string
	boot string // the sandbox's boot: connections of another are never reused
	tls  bool   // the port serves HTTPS (network.httpsPorts)
	host string // Host sent to the sandbox (network.maskRequestHost); "" keeps the client's
	own  bool   // the request came on the port's own host (not the API's)
}

// New returns a gateway resolving sandboxes through res.
func New(res Resolver, log *slog.Logger) *Gateway {
	g := &Gateway{res: res, log: log, guesses: authlimit.New(authlimit.Options{})}
	g.drainCtx, g.drain = context.WithCancel(context.Background())
	g.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			t := pr.In.Context().Value(targetKey{}).(target)
			scheme := "http"
			if t.tls {
				scheme = "https"
			}
			pr.SetURL(&url.URL{Scheme: scheme, Host: t.addr})
			pr.Out.Host = pr.In.Host
			if t.host != "" {
				pr.Out.Host = t.host
			}
		},
		Transport: newBoots(res),
		// Streams (SSE and every response without a Content-Length:
		// process output, NDJSON, chunked downloads) are flushed on every
		// write whatever this says; sized bodies are flushed at most this
		// often, so a file download goes out in large writes instead of
		// one flush per buffer.
		FlushInterval: 20 * time.Millisecond,
		BufferPool:    newBufferPool(256 << 10),
		ModifyResponse: func(resp *http.Response) error {
			t := resp.Request.Context().Value(targetKey{}).(target)
			// Every answer of a sandbox, WebSocket upgrades included,
			// passes here: its headers claim nothing past its port's host.
			scopeResponse(resp.Header, t.own)
			// What a sandbox answers on its ports is its own business and
			// never counts as a guess by the caller: code in the sandbox
			// can answer 401 to anything. The gateway judges the
			// credentials it knows before proxying (checkAccess).
			g.count(t.port, resp.StatusCode)
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			t := r.Context().Value(targetKey{}).(target)
			if r.Context().Err() != nil {
				// The client went away (no one to answer), or the sandbox
				// was removed under the request, which must not look like
				// an empty 200.
				if _, ok := g.res.Lookup(t.id); !ok {
					notFound(w, t.id)
				}
				return
			}
			g.count(t.port, http.StatusBadGateway)
			var opErr *net.OpError
			if errors.As(err, &opErr) && opErr.Op == "dial" {
				if _, ok := g.res.Lookup(t.id); !ok {
					notFound(w, t.id)
					return
				}
				httperr.WriteJSON(w, http.StatusBadGateway, map[string]any{"sandboxId": t.id, "message": "The sandbox is running but port is not open", "port": t.port, "code": http.StatusBadGateway})
				return
			}
			g.log.Debug("proxy error", "sandbox", t.id, "port", t.port, "err", err)
			httperr.WriteJSON(w, http.StatusBadGateway, map[string]any{"sandboxId": t.id, "message": "error talking to the sandbox: " + err.Error(), "port": t.port, "code": http.StatusBadGateway})
		},
	}
	return g
}

func notFound(w http.ResponseWriter, id string) {
	httperr.WriteJSON(w, http.StatusBadGateway, map[string]any{"sandboxId": id, "message": "The sandbox was not found", "code": http.StatusBadGateway})
}

func badRequest(w http.ResponseWriter, msg string) {
	httperr.WriteJSON(w, http.StatusBadRequest, map[string]any{"code": http.StatusBadRequest, "message": msg})
}

// Handler dispatches between the data plane and api.
func (g *Gateway) Handler(api http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, port, routed, errMsg := Route(r)
		if errMsg != "" {
			badRequest(w, errMsg)
			return
		}
		if routed && g.hostRoutedOutside(r) {
			routed = false
		}
		switch {
		case routed:
			// A port host never reaches the API (nor the dashboard).
			g.serve(w, r, id, port)
		case g.redirectPathForm(w, r):
		case r.URL.Path == "/files" && r.URL.Query().Get("signature") != "":
			g.serveSigned(w, r)
		default:
			APIHeaders(w.Header())
			api.ServeHTTP(w, r)
		}
	})
}

// Route extracts the sandbox target of a data-plane request from its
// E2b-Sandbox-Id/E2b-Sandbox-Port headers or a "<port>-<id>." Host; errMsg
// is a client error to answer with 400.
func Route(r *http.Request) (id string, port int, routed bool, errMsg string) {
	hid, hport := r.Header.Get("E2b-Sandbox-Id"), r.Header.Get("E2b-Sandbox-Port")
	if hid != "" || hport != "" {
		if hid == "" {
			return "", 0, false, "missing header E2b-Sandbox-Id"
		}
		if hport == "" {
			return "", 0, false, "missing header E2b-Sandbox-Port"
		}
		if !sandbox.ValidID(hid) {
			return "", 0, false, "Invalid sandbox ID"
		}
		p, err := strconv.Atoi(hport)
		if err != nil || p < 1 || p > 65535 {
			return "", 0, false, "Invalid sandbox port"
		}
		return hid, p, true, ""
	}
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	ph, ok, err := porthost.Parse(host)
	switch {
	case !ok:
		return "", 0, false, ""
	case err != nil:
		return "", 0, false, "Invalid sandbox port"
	}
	return ph.ID, ph.Port, true, ""
}

// internalEnvdPaths are envd routes only the server itself may call.
var internalEnvdPaths = map[string]bool{"/init": true}

// Waker is implemented by resolvers that wake sandboxes on traffic: thaw a
// frozen one, resume a paused one with autoResume. live is ctx, also
// cancelled when the sandbox is removed; done ends the request's activity
// (the idle timeout only counts time without requests in flight).
// check runs on the sandbox's record before anything wakes it.
type Waker interface {
	WakeIf(ctx context.Context, id string, check func(*sandbox.Sandbox) bool) (sb *sandbox.Sandbox, live context.Context, done func(), ok bool)
}

// wake finds the running sandbox id for traffic, waking it if the resolver
// can, once check (nil: none) has passed on its record; the traffic runs
// under live, and done must be called when it ends.
func (g *Gateway) wake(ctx context.Context, id string, check func(*sandbox.Sandbox) bool) (sb *sandbox.Sandbox, live context.Context, done func(), ok bool) {
	if wk, isWaker := g.res.(Waker); isWaker {
		return wk.WakeIf(ctx, id, check)
	}
	sb, ok = g.res.Lookup(id)
	if ok && check != nil && !check(sb) {
		return nil, nil, nil, false
	}
	return sb, ctx, func() {}, ok
}

func (g *Gateway) serve(w http.ResponseWriter, r *http.Request, id string, port int) {
	// Every return, refusals included, leaves the body read (finishBody).
	defer finishBody(r)
	if port == sandbox.EnvdPort && internalEnvdPaths[r.URL.Path] {
		httperr.WriteJSON(w, http.StatusNotFound, map[string]any{"code": http.StatusNotFound, "message": "not found"})
		return
	}
	// Credentials are judged on the record before the sandbox is woken: a
	// request with a wrong token never resumes or thaws anything.
	refused := false
	sb, live, done, ok := g.wake(r.Context(), id, func(rec *sandbox.Sandbox) bool {
		refused = !g.checkAccess(w, r, rec, port) || !g.checkTraffic(w, r, rec, port)
		return !refused
	})
	if !ok {
		if !refused {
			notFound(w, id)
		}
		return
	}
	defer done()
	release, ok := g.hold(w, r, id)
	if !ok {
		return
	}
	defer release()
	// A stream to a sandbox that is killed ends with it, and every stream
	// with the server's drain.
	live, stop := g.draining(live)
	defer stop()
	r = r.WithContext(live)
	// Full duplex: the sandbox often answers (and streams) before the proxy
	// has finished forwarding the request body. Without this, net/http
	// drains and closes the request body when the response starts, which
	// fails the upstream write and cuts the response short.
	_ = http.NewResponseController(w).EnableFullDuplex()
	t := target{id: id, port: port, addr: net.JoinHostPort(sb.IP.String(), strconv.Itoa(port)), boot: sb.BootID,
		own: g.onOwnOrigin(r, id, port)}
	g.admit(sb, port, &t)
	ctx := r.Context()
	r = r.WithContext(context.WithValue(ctx, targetKey{}, t))
	g.proxyDraining(w, r, func(w http.ResponseWriter, r *http.Request) { g.proxyAudited(w, r, sb, port) })
}

// finishBody reads what is left of a request body (a little) before the
// handler returns. With full duplex on, net/http does not drain an unread
// body before the response, and a body that first hits EOF while the
// server closes it after the handler (a proxy that answered 502 without
// forwarding it) starts a background read that races the next request on
// the connection ("invalid concurrent Body.Read call").
func finishBody(r *http.Request) {
	if r.Body == nil || r.Body == http.NoBody {
		return
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, 256<<10))
}

// serveSigned routes a header-less /files URL (sandbox.downloadUrl/uploadUrl)
// to the sandbox whose access token produced its signature. envd verifies the
// signature and its expiry again.
func (g *Gateway) serveSigned(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	op := "read"
	if r.Method == http.MethodPost || r.Method == http.MethodPut {
		op = "write"
	}
	sig := q.Get("signature")
	var signer string
	if !g.guesses.Guard(w, r, "signed URL", func() error {
		for _, sb := range g.res.Running() {
			if !sb.Secure {
				continue
			}
			want := Signature(q.Get("path"), op, q.Get("username"), g.res.Token(sb.ID), q.Get("signature_expiration"))
			if subtle.ConstantTimeCompare([]byte(want), []byte(sig)) == 1 {
				signer = sb.ID
				return nil
			}
		}
		return errBadSignature
	}, unauthorized) {
		return
	}
	g.serve(w, r, signer, sandbox.EnvdPort)
}

var (
	errBadSignature = fmt.Errorf("invalid signature: no running sandbox issued this URL (it may have been killed): %w", errdefs.ErrUnauthenticated)
	// errBadToken is envd's own answer to a wrong access token.
	errBadToken = fmt.Errorf("unauthorized access, please provide a valid access token or method signing if supported: %w", errdefs.ErrUnauthenticated)
)

// unauthorized answers a wrong credential the gateway judged with 401.
func unauthorized(w http.ResponseWriter, err error) {
	httperr.WriteJSON(w, http.StatusUnauthorized, map[string]any{"code": http.StatusUnauthorized, "message": httperr.Message(err)})
}

// checkAccess judges the sandbox access token of a request for envd's or
// the interpreter's port before it is proxied, so that a wrong token is
// counted as a guess by the limiter while a right one is always served.
// The gateway knows each sandbox's token; envd and the interpreter check
// it again. A request without a token is not judged here (envd's health,
// the interpreter's context routes, signed file URLs; envd answers those).
func (g *Gateway) checkAccess(w http.ResponseWriter, r *http.Request, sb *sandbox.Sandbox, port int) bool {
	if !sb.Secure || (port != sandbox.EnvdPort && port != InterpreterPort) {
		return true
	}
	tokens := r.Header.Values("X-Access-Token")
	if len(tokens) == 0 {
		return true
	}
	return g.guesses.Guard(w, r, "access token", func() error {
		want := []byte(g.res.Token(sb.ID))
		for _, tok := range tokens {
			if subtle.ConstantTimeCompare([]byte(tok), want) != 1 {
				return errBadToken
			}
		}
		return nil
	}, unauthorized)
}

// SetAuthLimiter replaces the limiter of failed token checks, e.g. with
// the API's, so one client's guesses count together. Call before serving.
func (g *Gateway) SetAuthLimiter(l *authlimit.Limiter) { g.guesses = l }

// Signature is E2B's file URL signature:
// "v1_" + base64(sha256("<path>:<operation>:<username>:<token>[:<expiration>]")).
func Signature(path, op, user, token, expiration string) string {
	s := path + ":" + op + ":" + user + ":" + token
	if expiration != "" {
		s += ":" + expiration
	}
	sum := sha256.Sum256([]byte(s))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}
