package egress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"
)

// connInfo is what the proxy knows about a connection it serves as HTTP.
type connInfo struct {
	b     *binding
	dst   netip.AddrPort
	tls   bool
	sni   string
	start time.Time

	mu       sync.Mutex
	lastHost string
	lastAddr netip.AddrPort
}

type infoKey struct{}

type targetKey struct{}

// target is where the proxy decided to send a request: addr, chosen for
// name.
type target struct {
	name string
	addr netip.AddrPort
}

// infoConn carries connInfo from the accept path into the HTTP server,
// and tells serve when the server is done with the connection.
type infoConn struct {
	net.Conn
	info   *connInfo
	once   sync.Once
	closed chan struct{}
}

func (c *infoConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// connServer is an http.Server fed connections one by one instead of
// accepting them itself.
type connServer struct {
	srv *http.Server
	ln  *chanListener
}

func newConnServer(h http.HandlerFunc) *connServer {
	ln := &chanListener{ch: make(chan net.Conn), done: make(chan struct{})}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 60 * time.Second,
		IdleTimeout:       120 * time.Second,
		ErrorLog:          log.New(io.Discard, "", 0),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if ic, ok := c.(*infoConn); ok {
				return context.WithValue(ctx, infoKey{}, ic.info)
			}
			return ctx
		},
	}
	go srv.Serve(ln)
	return &connServer{srv: srv, ln: ln}
}

// serve hands c to the HTTP server and returns when the server has closed
// it, so the caller's connection slot is held for as long as c is open.
func (cs *connServer) serve(c net.Conn, info *connInfo) {
	ic := &infoConn{Conn: c, info: info, closed: make(chan struct{})}
	select {
	case cs.ln.ch <- ic:
	case <-cs.ln.done:
		c.Close()
		return
	}
	<-ic.closed
}

func (cs *connServer) close() {
	if cs != nil {
		cs.srv.Close()
	}
}

type chanListener struct {
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *chanListener) Addr() net.Addr { return &net.TCPAddr{} }

// countingWriter counts response bytes and keeps http.ResponseController
// working (flush for streaming, hijack for WebSocket upgrades).
type countingWriter struct {
	http.ResponseWriter
	n      int64
	status int
}

func (w *countingWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(p)
	w.n += int64(n)
	return n, err
}

func (w *countingWriter) WriteHeader(code int) {
	if w.status == 0 || w.status < 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *countingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

type countingReader struct {
	io.ReadCloser
	n int64
}

func (r *countingReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	r.n += int64(n)
	return n, err
}

func hostname(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	return hostport
}

func deny(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Connection", "close")
	w.WriteHeader(status)
	fmt.Fprintln(w, msg)
}

// serveHTTP handles one request from a sandbox: plain HTTP on port 80, or
// HTTPS the proxy terminated for a domain with header rules.
//
// Header rules put credentials only into requests whose destination the
// proxy chose: it resolves the request's name itself and connects there
// (never to the address the sandbox dialled), over TLS verified against
// the host's roots, or plain HTTP when the rule says allowPlainHTTP.
func (s *Server) serveHTTP(rw http.ResponseWriter, r *http.Request) {
	info := r.Context().Value(infoKey{}).(*connInfo)
	ctx := r.Context()
	// The newest policy applies to every request, also on a connection
	// opened before the policy changed.
	b := s.lookup(info.b.ip)
	if b == nil || b.id != info.b.id {
		deny(rw, http.StatusBadGateway, "agentbox egress: the sandbox is gone")
		return
	}
	host := canonicalName(hostname(r.Host))
	e := &connEvent{start: time.Now(), b: b, dst: info.dst, name: host, proto: "http"}
	if info.tls {
		e.proto = "https"
	}
	body := &countingReader{ReadCloser: r.Body}
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = body
	}
	w := &countingWriter{ResponseWriter: rw}
	fields := map[string]any{"method": r.Method, "path": r.URL.Path}
	defer func() {
		e.sent, e.received = body.n, w.n
		fields["status"] = w.status
		s.record(ctx, e, "request", fields)
	}()
	if r.Method == http.MethodConnect {
		// A CONNECT tunnel would carry bytes the proxy cannot see to a
		// destination the sandbox names.
		e.rule = "CONNECT is not proxied"
		deny(w, http.StatusMethodNotAllowed, "agentbox egress: CONNECT is not proxied; connect to the destination directly")
		return
	}
	if info.tls && host != info.sni {
		e.rule = "Host header " + strconv.Quote(host) + " differs from the TLS server name " + strconv.Quote(info.sni)
		deny(w, http.StatusMisdirectedRequest, "agentbox egress: "+e.rule)
		return
	}
	port := info.dst.Port()
	inject := b.policy.InjectFor(host, info.tls)
	if !info.tls && len(inject) == 0 && len(b.policy.RulesFor(host)) > 0 {
		fields["notInjected"] = "plain HTTP; the rule does not set allowPlainHTTP"
	}
	var (
		addr    netip.AddrPort
		tr      *http.Transport
		urlHost string
	)
	if info.tls || len(inject) > 0 {
		t, v, err := s.ruleTarget(ctx, b, host, port)
		if err != nil {
			e.err = err.Error()
			e.rule = "credentials are sent only where the rule's domain resolves"
			deny(w, http.StatusBadGateway, "agentbox egress: "+err.Error())
			return
		}
		e.allow, e.rule = v.Allow, v.Rule
		if !v.Allow {
			deny(w, http.StatusForbidden, fmt.Sprintf("agentbox egress: %s (%s) is not allowed for this sandbox: %s", host, t.Addr(), v.Rule))
			return
		}
		// The transport's connections are keyed by this name and dialled
		// only to where the proxy resolved it.
		addr, tr, urlHost = t, b.named, net.JoinHostPort(host, strconv.Itoa(int(port)))
	} else {
		v, byName := b.policy.DecideName(host, info.dst.Addr())
		e.allow, e.rule = v.Allow, v.Rule
		if !v.Allow {
			deny(w, http.StatusForbidden, fmt.Sprintf("agentbox egress: %s (%s) is not allowed for this sandbox: %s", host, info.dst, v.Rule))
			return
		}
		t, err := s.requestTarget(ctx, info, e, byName)
		if err != nil {
			e.allow, e.err = false, err.Error()
			deny(w, http.StatusBadGateway, "agentbox egress: "+err.Error())
			return
		}
		// Keyed by the address dialled: a pooled connection never serves
		// a request meant for another destination.
		addr, tr, urlHost = t, b.direct, t.String()
	}
	if addr != info.dst {
		e.upstream = addr.String()
	}
	if up := b.policy.Upstream; up != nil {
		e.upstream = up.Scheme + "://" + up.Address + " → " + addr.String()
	}
	if len(inject) > 0 {
		fields["injected"] = len(inject)
	}
	scheme := "http"
	if info.tls {
		scheme = "https"
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = scheme
			pr.Out.URL.Host = urlHost
			pr.Out.Host = pr.In.Host
			for _, t := range inject {
				for k, v := range t.Headers {
					pr.Out.Header.Set(k, v)
				}
			}
		},
		Transport:     tr,
		FlushInterval: -1,
		ErrorLog:      log.New(io.Discard, "", 0),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errors.Is(err, context.Canceled) {
				return
			}
			e.err = err.Error()
			deny(w, http.StatusBadGateway, "agentbox egress: "+err.Error())
		},
	}
	rp.ServeHTTP(w, r.WithContext(context.WithValue(ctx, targetKey{}, &target{name: host, addr: addr})))
}

// canonicalName is the form names are matched in: lower case, no
// trailing dot.
func canonicalName(h string) string { return strings.TrimSuffix(strings.ToLower(h), ".") }

// requestTarget is target() with a one-entry cache per connection: a
// keep-alive connection usually repeats its Host.
func (s *Server) requestTarget(ctx context.Context, info *connInfo, e *connEvent, byName bool) (netip.AddrPort, error) {
	if !byName {
		return info.dst, nil
	}
	info.mu.Lock()
	if info.lastHost == e.name {
		a := info.lastAddr
		info.mu.Unlock()
		return a, nil
	}
	info.mu.Unlock()
	a, err := s.target(ctx, e, true)
	if err != nil {
		return a, err
	}
	info.mu.Lock()
	info.lastHost, info.lastAddr = e.name, a
	info.mu.Unlock()
	return a, nil
}
