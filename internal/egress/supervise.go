package egress

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// The egress proxy's listeners (the proxy's, and the resolver's TCP and
// UDP sockets) are supervised: when one dies while the server runs (closed
// under it, as FailProxy does), it is opened again on the same address and
// port, which every sandbox's nftables redirect names, so the sandboxes
// keep their egress without being told. Connections accepted before keep
// running on their own goroutines.
type supervisor struct {
	mu       sync.Mutex
	sock     io.Closer // the open listener or packet socket
	closing  bool
	done     chan struct{}
	restarts int
}

func newSupervisor() *supervisor { return &supervisor{done: make(chan struct{})} }

// close marks the server closing and returns the socket to close.
func (p *supervisor) close() io.Closer {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.closing {
		p.closing = true
		close(p.done)
	}
	return p.sock
}

// supervise serves sock (serve returns when it is closed) and opens it
// again with open each time it dies, until Close.
func (s *Server) supervise(p *supervisor, what string, sock io.Closer, open func() (io.Closer, error), serve func(io.Closer)) {
	p.mu.Lock()
	p.sock = sock
	p.mu.Unlock()
	for {
		serve(sock)
		for wait := 10 * time.Millisecond; ; wait = min(2*wait, time.Second) {
			p.mu.Lock()
			if p.closing {
				p.mu.Unlock()
				return
			}
			ns, err := open()
			if err == nil {
				p.sock, sock = ns, ns
				p.restarts++
				p.mu.Unlock()
				s.log.Warn("egress "+what+" died; listening again on the same address", "restarts", p.restarts)
				break
			}
			p.mu.Unlock()
			s.log.Error("egress "+what+" died and cannot listen again yet; sandboxes have no egress meanwhile", "err", err)
			select {
			case <-p.done:
				return
			case <-time.After(wait):
			}
		}
	}
}

// superviseAll serves the proxy's and the resolver's sockets under
// supervision; lc and the addresses open them again.
func (s *Server) superviseAll(ctx context.Context, lc net.ListenConfig, ln, tl net.Listener, ul net.PacketConn) {
	ctx = context.WithoutCancel(ctx)
	listen := func(addr string) func() (io.Closer, error) {
		return func() (io.Closer, error) { return lc.Listen(ctx, "tcp4", addr) }
	}
	s.wg.Add(3)
	go func() {
		defer s.wg.Done()
		s.supervise(s.sockets[0], "proxy listener", ln, listen(ln.Addr().String()),
			func(c io.Closer) { s.acceptLoop(c.(net.Listener), s.handle) })
	}()
	go func() {
		defer s.wg.Done()
		s.supervise(s.sockets[1], "resolver TCP listener", tl, listen(tl.Addr().String()),
			func(c io.Closer) { s.acceptLoop(c.(net.Listener), s.serveDNSTCP) })
	}()
	go func() {
		defer s.wg.Done()
		addr := ul.LocalAddr().String()
		s.supervise(s.sockets[2], "resolver UDP socket", ul,
			func() (io.Closer, error) { return lc.ListenPacket(ctx, "udp4", addr) },
			func(c io.Closer) { s.serveDNSUDP(c.(net.PacketConn)) })
	}()
}

// closeSockets stops the supervision and closes the sockets.
func (s *Server) closeSockets() error {
	var errs []error
	for _, p := range s.sockets {
		if c := p.close(); c != nil {
			errs = append(errs, c.Close())
		}
	}
	return errors.Join(errs...)
}

// FailProxy closes the proxy's and the resolver's sockets under the
// running server, as a crash of the proxy would (fault tests: serve
// --test-fail-egress-proxy).
func (s *Server) FailProxy() {
	for _, p := range s.sockets {
		p.mu.Lock()
		c := p.sock
		p.mu.Unlock()
		if c != nil {
			_ = c.Close()
		}
	}
}

// ProxyRestarts is how many times the proxy's listener was opened again.
func (s *Server) ProxyRestarts() int {
	p := s.sockets[0]
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.restarts
}
