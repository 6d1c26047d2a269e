package outside

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/agentbox/agentbox/bench/benchmark"
	"github.com/agentbox/agentbox/e2e/wire"
)

// recoverFromGVisorBomb is the fork bomb row on gVisor, where the bomb's
// host cost (a host stub process and kernel memory per address space)
// outgrows what the sentry accounts to the sandbox and, unguarded, the
// host's OOM killer ends the whole sandbox. The server's host memory guard
// (internal/runtime/runsc/guard.go) kills the sandbox's commands first: the
// bomb's command ends by itself, the owner's next command runs within
// deadline, the sandbox's logs say why (a "host-memory" limit event), and
// its host cgroup never hit the OOM killer; a neighbour answers throughout. When the bomb is still running
// after its growth window the owner kills it, as on runc.
func recoverFromGVisorBomb(ctx context.Context, c *wire.Client, s *target, sb *wire.Sandbox, deadline, perCall time.Duration) (time.Duration, error) {
	const tag = "fork-bomb"
	neighbour, err := c.Create(ctx, wire.CreateRequest{TemplateID: "base", Timeout: 300, Metadata: map[string]string{"outside": "reserve-neighbour"}})
	if err != nil {
		return 0, fmt.Errorf("create a neighbour: %w", err)
	}
	defer func() { _ = c.Kill(context.Background(), neighbour.SandboxID) }()
	bombDone := make(chan struct{})
	go func() {
		defer close(bombDone)
		_, _ = c.RunTagged(ctx, sb, "root", benchmark.ForkBomb, tag)
	}()
	// Unguarded, the host cgroup fills within ~10 s here; the guard acts
	// before. A minute bounds the wait either way.
	select {
	case <-bombDone:
	case <-time.After(time.Minute):
		kctx, cancel := context.WithTimeout(ctx, perCall)
		err := c.Signal(kctx, sb, tag, true)
		cancel()
		if err != nil {
			return 0, fmt.Errorf("the fork bomb still ran after a minute and the owner could not kill it: %w", err)
		}
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	ended := time.Now()
	if res, err := c.Run(ctx, neighbour, "", "echo ok"); err != nil {
		return 0, fmt.Errorf("a neighbour sandbox does not answer after the fork bomb: %w", err)
	} else if strings.TrimSpace(res.Stdout) != "ok" {
		return 0, fmt.Errorf("a neighbour sandbox does not answer after the fork bomb: %+v", res)
	}
	var last error
	for time.Since(ended) < deadline {
		cctx, cancel := context.WithTimeout(ctx, perCall)
		res, err := c.Run(cctx, sb, "", "echo ok")
		cancel()
		if err == nil && strings.TrimSpace(res.Stdout) == "ok" {
			last = nil
			break
		}
		last = errors.Join(err, fmt.Errorf("echo ok: %+v", res))
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	if last != nil {
		return 0, fmt.Errorf("no echo of the owner succeeded within %s of the fork bomb's end: %w", deadline, last)
	}
	took := time.Since(ended)
	// The reason is recorded by the health sampler: wait for it.
	var body string
	for start := time.Now(); time.Since(start) < time.Minute; {
		_, b, err := s.Do(ctx, s.APIKey, http.MethodGet, "/v2/sandboxes/"+sb.SandboxID+"/logs?kind=limit&limit=100", nil)
		if err == nil && strings.Contains(string(b), "host-memory") {
			if strings.Contains(string(b), "out of memory") {
				return 0, fmt.Errorf("the guard acted, but only after the host cgroup's OOM killer: %.300s", b)
			}
			return took, nil
		}
		body = string(b)
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	return 0, fmt.Errorf("the owner's command runs again but the sandbox's logs name no host-memory guard event: %.300s", body)
}
