package gateway

import (
	"context"
	"encoding/binary"
	"errors"
	"net/http"
	"strings"
)

// errDraining ends the proxied requests when the server shuts down.
var errDraining = errors.New("the server is shutting down")

// drainEnd is the Connect end-of-stream message a streaming call gets when
// the server shuts down under it: a client sees a clear, retryable
// "unavailable" error rather than a connection cut mid-stream.
const drainEnd = `{"error":{"code":"unavailable","message":"the agentbox server is shutting down; the call was ended, retry it"}}`

// Drain ends every request the gateway is proxying: a Connect stream gets
// its end-of-stream message with an "unavailable" error, anything else is
// cut as before. The server calls it when the shutdown grace runs out.
func (g *Gateway) Drain() { g.drain() }

// draining derives a request context that also ends on Drain.
func (g *Gateway) draining(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(g.drainCtx, func() { cancel(errDraining) })
	return ctx, func() { stop(); cancel(nil) }
}

// connectStream follows the envelopes of a Connect streaming response (one
// flags byte, a 4-byte big-endian length, the message) as they pass, so that
// on a drain it knows whether the stream already ended and whether an
// envelope may start here.
type connectStream struct {
	http.ResponseWriter
	streaming bool // a 200 response with a Connect streaming content type
	wrote     bool // headers sent
	hdr       [5]byte
	nhdr      int    // header bytes of the current envelope seen
	left      uint32 // message bytes of the current envelope still to come
	ended     bool   // the end-of-stream envelope went out
}

func (c *connectStream) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// Flush passes a flush on: the proxy and the audit taps flush every
// message of a stream, and a writer in between that dropped it would hold
// a command's start event back.
func (c *connectStream) Flush() { _ = c.FlushError() }

// FlushError is Flush for http.ResponseController.
func (c *connectStream) FlushError() error {
	return http.NewResponseController(c.ResponseWriter).Flush()
}

func (c *connectStream) WriteHeader(code int) {
	if !c.wrote {
		c.wrote = true
		c.streaming = code == http.StatusOK && strings.HasPrefix(c.Header().Get("Content-Type"), "application/connect+")
	}
	c.ResponseWriter.WriteHeader(code)
}

func (c *connectStream) Write(p []byte) (int, error) {
	if !c.wrote {
		c.WriteHeader(http.StatusOK)
	}
	n, err := c.ResponseWriter.Write(p)
	if c.streaming {
		c.follow(p[:n])
	}
	return n, err
}

func (c *connectStream) follow(p []byte) {
	for len(p) > 0 {
		if c.left > 0 {
			k := min(uint32(len(p)), c.left)
			c.left -= k
			p = p[k:]
			continue
		}
		k := copy(c.hdr[c.nhdr:], p)
		c.nhdr += k
		p = p[k:]
		if c.nhdr == len(c.hdr) {
			c.nhdr = 0
			c.left = binary.BigEndian.Uint32(c.hdr[1:])
			if c.hdr[0]&0x02 != 0 {
				c.ended = true
			}
		}
	}
}

// end writes the end-of-stream envelope if the stream is open and between
// envelopes; it reports whether it did.
func (c *connectStream) end() bool {
	if !c.streaming || c.ended || c.left != 0 || c.nhdr != 0 {
		return false
	}
	env := make([]byte, 5, 5+len(drainEnd))
	env[0] = 0x02
	binary.BigEndian.PutUint32(env[1:], uint32(len(drainEnd)))
	env = append(env, drainEnd...)
	if _, err := c.ResponseWriter.Write(env); err != nil {
		return false
	}
	c.ended = true
	_ = http.NewResponseController(c.ResponseWriter).Flush()
	return true
}

// proxyDraining runs proxy with w followed as a Connect stream; when a drain
// cut the stream (the reverse proxy aborts the handler on a failed copy), it
// ends the stream with its end-of-stream message instead of a cut
// connection.
func (g *Gateway) proxyDraining(w http.ResponseWriter, r *http.Request, proxy func(http.ResponseWriter, *http.Request)) {
	if !strings.HasPrefix(r.Header.Get("Content-Type"), "application/connect+") {
		proxy(w, r)
		return
	}
	c := &connectStream{ResponseWriter: w}
	defer func() {
		v := recover()
		if g.drainCtx.Err() != nil && c.end() {
			if v != nil && v != http.ErrAbortHandler {
				panic(v)
			}
			return
		}
		if v != nil {
			panic(v)
		}
	}()
	proxy(c, r)
}
