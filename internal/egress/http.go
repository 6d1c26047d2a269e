package egress

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strconv"
	"sync"
	"time"
)

// connInfo is what the proxy knows about a connection it serves as HTTP.
type connInfo struct {
	b      *binding
	dst    netip.AddrPort
	tls    bool
	sni    string
	target netip.AddrPort // for TLS: where the ClientHello's name was sent
	start  time.Time

	mu       sync.Mutex
	lastHost string
	lastAddr netip.AddrPort
}

type infoKey struct{}

type targetKey struct{}

type target struct{ addr netip.AddrPort }

// infoConn carries connInfo from the accept path into the HTTP server.
type infoConn struct {
	net.Conn
	info *connInfo
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

func (cs *connServer) serve(c net.Conn, info *connInfo) {
	select {
	case cs.ln.ch <- &infoConn{Conn: c, info: info}:
	case <-cs.ln.done:
		c.Close()
	}
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
	host := hostname(r.Host)
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
		if _, reset := fields["status"]; !reset {
			fields["status"] = w.status
		}
		s.record(ctx, e, "request", fields)
	}()
	if info.tls && host != info.sni {
		e.rule = "Host header " + strconv.Quote(host) + " differs from the TLS server name " + strconv.Quote(info.sni)
		deny(w, http.StatusMisdirectedRequest, "agentbox egress: "+e.rule)
		return
	}
	v, byName := b.policy.DecideName(host, info.dst.Addr())
	e.allow, e.rule = v.Allow, v.Rule
	if !v.Allow {
		// Refuse like every other denied connection (a reset, not an HTTP
		// answer a client could take for the server's).
		fields["status"] = "reset"
		if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
			hardClose(c)
			return
		}
		deny(w, http.StatusForbidden, fmt.Sprintf("agentbox egress: %s is not allowed for this sandbox (%s)", host, v.Rule))
		return
	}
	addr, err := s.requestTarget(ctx, info, e, byName)
	if err != nil {
		e.allow, e.err = false, err.Error()
		deny(w, http.StatusBadGateway, "agentbox egress: "+err.Error())
		return
	}
	if addr != info.dst {
		e.upstream = addr.String()
	}
	if up := b.policy.Upstream; up != nil {
		e.upstream = up.Scheme + "://" + up.Address + " → " + addr.String()
	}
	transforms := b.policy.RulesFor(host)
	if len(transforms) > 0 {
		fields["injected"] = len(transforms)
	}
	scheme := "http"
	if info.tls {
		scheme = "https"
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = scheme
			pr.Out.URL.Host = net.JoinHostPort(host, strconv.Itoa(int(info.dst.Port())))
			pr.Out.Host = pr.In.Host
			for _, t := range transforms {
				for k, v := range t.Headers {
					pr.Out.Header.Set(k, v)
				}
			}
		},
		Transport:     b.transport,
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
	rp.ServeHTTP(w, r.WithContext(context.WithValue(ctx, targetKey{}, &target{addr: addr})))
}

// requestTarget is target() with a one-entry cache per connection: a
// keep-alive connection usually repeats its Host.
func (s *Server) requestTarget(ctx context.Context, info *connInfo, e *connEvent, byName bool) (netip.AddrPort, error) {
	if !byName {
		return info.dst, nil
	}
	if info.tls && info.target.IsValid() {
		return info.target, nil
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

// hardClose resets the sandbox's TCP connection under c.
func hardClose(c net.Conn) {
	for {
		switch v := c.(type) {
		case *infoConn:
			c = v.Conn
		case *tls.Conn:
			c = v.NetConn()
		case *replayConn:
			reset(v.TCPConn)
			return
		case *net.TCPConn:
			reset(v)
			return
		default:
			c.Close()
			return
		}
	}
}
