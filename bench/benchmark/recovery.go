package benchmark

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/agentbox/agentbox/e2e/wire"
)

// OwnerRecovery runs abuse a in sb as root for secs seconds, then times how
// long after the abuse's command returned the owner's `echo ok` first
// succeeds: how soon a sandbox's control plane answers again after its own
// workload ran wild (envd keeps a reserve of pids and memory for that). The
// abuse's command may itself fail; it must return within secs+deadline.
// Each echo waits at most perCall; trying stops deadline after the abuse
// ended, with the last failure.
func OwnerRecovery(ctx context.Context, c *wire.Client, sb *wire.Sandbox, a Abuse, secs int, deadline, perCall time.Duration) (time.Duration, error) {
	actx, cancel := context.WithTimeout(ctx, time.Duration(secs)*time.Second+deadline)
	_, err := c.Run(actx, sb, "root", a.Script(secs))
	cancel()
	if err != nil && actx.Err() != nil {
		return 0, fmt.Errorf("the %s's own command did not return within %s of its end: %w", a.Name, deadline, err)
	}
	start := time.Now()
	var last error
	for time.Since(start) < deadline {
		cctx, cancel := context.WithTimeout(ctx, min(perCall, deadline-time.Since(start)+time.Second))
		res, err := c.Run(cctx, sb, "", "echo ok")
		cancel()
		switch {
		case err != nil:
			last = err
		case strings.TrimSpace(res.Stdout) != "ok":
			last = fmt.Errorf("echo ok: exit %d, stdout %q, stderr %q", res.ExitCode, res.Stdout, res.Stderr)
		default:
			return time.Since(start), nil
		}
		// Paced, so a quick refusal does not turn into a flood of requests.
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return 0, fmt.Errorf("no echo of the owner succeeded within %s after the %s: %w", deadline, a.Name, last)
}
