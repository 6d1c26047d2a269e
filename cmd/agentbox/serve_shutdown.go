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
// finish, and what still runs then is ended: drain (the gateway's) ends
// Connect streams (commands, watches) with an "unavailable" end-of-stream
// message, and a moment later the connections still busy (long transfers,
// other streams) are closed, so a client sees its call fail rather than
// hang or pass as complete. It reports whether anything was cut.
func shutdownServers(servers []*http.Server, grace time.Duration, drain func(), log *slog.Logger) bool {
	if drain != nil {
		t := time.AfterFunc(grace, drain)
		defer t.Stop()
		grace += drainWait
	}
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

// drainWait is how long ended streams get to send their end message before
// their connections are closed.
const drainWait = 2 * time.Second
