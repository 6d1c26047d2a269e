package envd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// ListenAndServe serves s on addr over HTTP/1.1 and h2c until ctx ends.
// MPTCP is disabled: Landlock's TCP rules miss it and CRIU cannot
// checkpoint it.
func (s *Server) ListenAndServe(ctx context.Context, addr string) error {
	lc := net.ListenConfig{}
	lc.SetMultipathTCP(false)
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", addr, err)
	}
	return s.Serve(ctx, ln)
}

// Serve serves s on ln until ctx ends, then shuts down gracefully.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	protos := new(http.Protocols)
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	srv := &http.Server{
		Handler:           s.Handler(),
		Protocols:         protos,
		ReadHeaderTimeout: 30 * time.Second,
		// Streams (process output, watches) last as long as they need.
		ReadTimeout:  0,
		WriteTimeout: 0,
		IdleTimeout:  640 * time.Second,
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	s.log.Info("envd listening", "addr", ln.Addr().String(), "version", Version)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := srv.Shutdown(shutdownCtx)
	s.Close()
	if errors.Is(err, context.DeadlineExceeded) {
		return srv.Close()
	}
	return err
}
