package egress

import (
	"context"
	"net"
	"sync"
	"time"
)

// The proxy's listener is supervised: when it dies while the server runs
// (closed under it, as FailProxy does), it is opened again on the same
// address and port, which every sandbox's nftables redirect names, so the
// sandboxes keep their egress without being told. Connections accepted
// before keep running on their own goroutines.
type proxySupervisor struct {
	mu       sync.Mutex
	ln       net.Listener
	closing  bool
	done     chan struct{}
	restarts int
}

func newProxySupervisor() *proxySupervisor { return &proxySupervisor{done: make(chan struct{})} }

// close marks the server closing and returns the listener to close.
func (p *proxySupervisor) close() net.Listener {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.closing {
		p.closing = true
		close(p.done)
	}
	return p.ln
}

// superviseProxy serves ln and opens it again each time it dies, until
// Close.
func (s *Server) superviseProxy(ctx context.Context, lc net.ListenConfig, ln net.Listener) {
	p := s.proxy
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	addr := ln.Addr().String()
	for {
		s.acceptLoop(ln, s.handle)
		for wait := 10 * time.Millisecond; ; wait = min(2*wait, time.Second) {
			p.mu.Lock()
			if p.closing {
				p.mu.Unlock()
				return
			}
			nl, err := lc.Listen(context.WithoutCancel(ctx), "tcp4", addr)
			if err == nil {
				p.ln, ln = nl, nl
				p.restarts++
				p.mu.Unlock()
				s.log.Warn("egress proxy listener died; listening again on the same address", "addr", addr)
				break
			}
			p.mu.Unlock()
			s.log.Error("egress proxy listener died and cannot listen again yet; sandboxes have no egress meanwhile", "addr", addr, "err", err)
			select {
			case <-p.done:
				return
			case <-time.After(wait):
			}
		}
	}
}

// FailProxy closes the proxy's listener under the running server, as a
// crash of it would (fault tests: serve --test-fail-egress-proxy).
func (s *Server) FailProxy() {
	s.proxy.mu.Lock()
	ln := s.proxy.ln
	s.proxy.mu.Unlock()
	if ln != nil {
		_ = ln.Close()
	}
}

// ProxyRestarts is how many times the proxy's listener was opened again.
func (s *Server) ProxyRestarts() int {
	s.proxy.mu.Lock()
	defer s.proxy.mu.Unlock()
	return s.proxy.restarts
}
