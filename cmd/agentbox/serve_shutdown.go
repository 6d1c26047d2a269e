package main

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"time"
)

// shutdownServers stops servers on SIGTERM without touching a sandbox: each
// stops accepting connections at once, requests in flight get grace to
// finish, and what still runs then (command streams, long transfers) is cut
// by closing its connection, so a client sees its call fail (a stream
// without its end message, a transfer without its response) rather than
// hang or pass as complete. It reports whether anything was cut.
func shutdownServers(servers []*http.Server, grace time.Duration, log *slog.Logger) bool {
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		cut bool
	)
	for _, srv := range servers {
		wg.Go(func() {
			err := srv.Shutdown(ctx)
			if err == nil {
				return
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				log.Warn("shutdown", "err", err)
			}
			// Close the connections still busy, so their handlers end now
			// rather than run on while the store closes under them.
			_ = srv.Close()
			mu.Lock()
			cut = true
			mu.Unlock()
		})
	}
	wg.Wait()
	if cut {
		log.Info("requests still running after the shutdown grace were cut; their clients see a failed call", "grace", grace)
	}
	return cut
}
