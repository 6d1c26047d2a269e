package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"

	"github.com/agentbox/agentbox/internal/envdclient"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// The dashboard's terminal and file browser reach a sandbox's envd through
// the data plane (the gateway) like every other client: each envd call is
// handed to the data-plane handler in process, as a request routed by the
// E2b-Sandbox-Id/E2b-Sandbox-Port headers from the browser's address, so
// the gateway's admission (access token, per-client and per-sandbox
// bounds), wake and audit apply to it exactly as to an SDK's.

// SetDataPlane sets the handler of data-plane requests (the gateway's),
// which the dashboard's sandbox calls go through. Call before serving.
func (s *Server) SetDataPlane(h http.Handler) { s.dataPlane = h }

// envdThroughGateway is a client of sandbox sb's envd whose calls go
// through the data plane on behalf of the browser request from; refused
// keeps the data plane's last refusal, which an envd client reports only
// by its status.
func (s *Server) envdThroughGateway(from *http.Request, sb *sandbox.Sandbox) (*envdclient.Client, *refusal, error) {
	if s.dataPlane == nil {
		return nil, nil, errors.Join(errors.New("the dashboard's sandbox calls need the server's gateway, which this server lacks"), errdefs.ErrUnavailable)
	}
	token := ""
	if sb.Secure {
		token = s.mgr.Token(sb.ID)
	}
	refused := &refusal{}
	hc := &http.Client{Transport: inProcess{h: s.dataPlane, from: from, id: sb.ID, port: sandbox.EnvdPort, refused: refused}}
	return envdclient.New(hc, sb.IP, token), refused, nil
}

// refusal is an error answer of the data plane: a JSON {code, message}
// (the gateway's bounds, a missing sandbox) or envd's own.
type refusal struct {
	mu      sync.Mutex
	status  int
	message string
}

func (r *refusal) set(status int, body []byte) {
	var e struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(body, &e) != nil || e.Message == "" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.status, r.message = status, e.Message
}

// get returns the last refusal (status 0: none).
func (r *refusal) get() (int, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.status, r.message
}

// inProcess is a RoundTripper that serves each request with h in this
// process, as a data-plane request to port of sandbox id from the client
// of from (its address and the forwarding headers a trusted proxy sets).
// The response streams: its body is what h writes, as h writes it.
type inProcess struct {
	h       http.Handler
	from    *http.Request
	id      string
	port    int
	refused *refusal // nil: not kept
}

func (t inProcess) RoundTrip(req *http.Request) (*http.Response, error) {
	in := req.Clone(req.Context())
	in.URL = &url.URL{Path: req.URL.Path, RawPath: req.URL.RawPath, RawQuery: req.URL.RawQuery}
	in.RequestURI = in.URL.RequestURI()
	in.Host = t.from.Host
	in.RemoteAddr = t.from.RemoteAddr
	in.Proto, in.ProtoMajor, in.ProtoMinor = "HTTP/1.1", 1, 1
	if in.Body == nil {
		in.Body = http.NoBody
	}
	if in.Body != http.NoBody && in.ContentLength == 0 {
		// A client request's 0 with a body means unknown; a server
		// request's means none, which a proxy would forward as empty.
		in.ContentLength = -1
	}
	for _, h := range []string{"X-Forwarded-For", "X-Real-Ip", "Forwarded"} {
		if v := t.from.Header.Values(h); len(v) > 0 {
			in.Header[h] = v
		}
	}
	in.Header.Set("E2b-Sandbox-Id", t.id)
	in.Header.Set("E2b-Sandbox-Port", strconv.Itoa(t.port))
	pr, pw := io.Pipe()
	rw := &pipeResponse{header: http.Header{}, body: pw, started: make(chan struct{})}
	go func() {
		defer func() {
			// A proxy aborts a response it cannot finish with
			// http.ErrAbortHandler, which net/http recovers; so does this.
			if v := recover(); v != nil {
				if v != http.ErrAbortHandler {
					pw.CloseWithError(errors.New("data plane: handler panicked"))
					panic(v)
				}
				pw.CloseWithError(io.ErrUnexpectedEOF)
			}
			rw.WriteHeader(http.StatusOK) // an empty answer
			_ = pw.Close()
		}()
		t.h.ServeHTTP(rw, in)
	}()
	select {
	case <-rw.started:
	case <-req.Context().Done():
		_ = pr.CloseWithError(req.Context().Err())
		return nil, req.Context().Err()
	}
	n := int64(-1)
	if v, err := strconv.ParseInt(rw.sent.Get("Content-Length"), 10, 64); err == nil {
		n = v
	}
	var body io.ReadCloser = pr
	if rw.status >= 400 && t.refused != nil && strings.HasPrefix(rw.sent.Get("Content-Type"), "application/json") {
		// An error answer is small: read it whole, keep what it says.
		b, _ := io.ReadAll(io.LimitReader(pr, 64<<10))
		_ = pr.Close()
		t.refused.set(rw.status, b)
		body, n = io.NopCloser(bytes.NewReader(b)), int64(len(b))
	}
	return &http.Response{
		Status: strconv.Itoa(rw.status) + " " + http.StatusText(rw.status), StatusCode: rw.status,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: rw.sent, Body: body, ContentLength: n, Request: req,
	}, nil
}

// pipeResponse is the ResponseWriter of an in-process request: the status
// and headers are taken at the first WriteHeader (or Write), the body goes
// into a pipe the RoundTripper's caller reads.
type pipeResponse struct {
	header  http.Header
	body    *io.PipeWriter
	once    sync.Once
	started chan struct{}
	status  int
	sent    http.Header
}

func (p *pipeResponse) Header() http.Header { return p.header }

func (p *pipeResponse) WriteHeader(code int) {
	if code < 200 {
		return // informational: the caller waits for the final answer
	}
	p.once.Do(func() {
		p.status, p.sent = code, p.header.Clone()
		close(p.started)
	})
}

func (p *pipeResponse) Write(b []byte) (int, error) {
	p.WriteHeader(http.StatusOK)
	n, err := p.body.Write(b)
	if errors.Is(err, io.ErrClosedPipe) {
		// The caller closed the body without reading it all, as a client
		// hangs up on a server that has written into its socket: the
		// handler finishes (and records what it records); the rest goes
		// nowhere. A caller that is gone for good cancels the context.
		return len(b), nil
	}
	return n, err
}

// Flush is a no-op: every Write reaches the reader as it happens.
func (p *pipeResponse) Flush() {}
