package sandbox

import (
	"fmt"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// DefaultMaxCommandLifetime is the server's cap on how long one command
// (Process.Start) may run when Config.MaxCommandLifetime is zero. envd
// enforces it on every start, whatever timeout the client asked for, so a
// forgotten process cannot hold a sandbox's CPU for longer.
const DefaultMaxCommandLifetime = 24 * time.Hour

// resolveCommandLifetime returns the command lifetime cap of a new sandbox:
// the request's (which may only lower the server's), else the server's.
func (s *starter) resolveCommandLifetime(req time.Duration) (time.Duration, error) {
	limit := s.cfg.MaxCommandLifetime
	switch {
	case req < 0:
		return 0, fmt.Errorf("maxCommandSeconds: %d is negative; omit it for the server's cap of %s: %w", int64(req/time.Second), limit, errdefs.ErrInvalidArgument)
	case req == 0:
		return limit, nil
	case req < time.Second:
		return 0, fmt.Errorf("maxCommandSeconds: must be at least 1: %w", errdefs.ErrInvalidArgument)
	case req > limit:
		return 0, fmt.Errorf("maxCommandSeconds: %d is over this server's maximum command lifetime of %d seconds (%s, --max-command-lifetime): %w",
			int64(req/time.Second), int64(limit/time.Second), limit, errdefs.ErrInvalidArgument)
	}
	return req, nil
}
