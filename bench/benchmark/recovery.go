package benchmark

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentbox/agentbox/internal/runtime"

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

// parallelReads is how many files the owner reads at once during the bomb.
const parallelReads = 32

// ForkBomb is the shell's classic fork bomb, which never ends by itself;
// the command's own shell then becomes a sleep (no fork needed), so the
// command runs until its owner kills it.
const ForkBomb = `:(){ :|:& };:; exec sleep 3600`

// ErrNeverBlocked is RecoverFromForkBomb's answer when the owner's commands
// kept running for the whole bomb (gVisor's Sentry, for one, never lets the
// bomb fill the limit): there was nothing to recover from.
var ErrNeverBlocked = errors.New("the fork bomb never kept the owner from running a command")

// userPidsCmd prints the user cgroup's pids.current and pids.max (cgroup v1
// as runc and gVisor show it, else v2 as the microVM's guest does).
const userPidsCmd = `cat /sys/fs/cgroup/pids/user/pids.current /sys/fs/cgroup/pids/user/pids.max 2>/dev/null || cat /sys/fs/cgroup/user/pids.current /sys/fs/cgroup/user/pids.max`

// RecoverFromForkBomb starts ForkBomb in sb as root and waits until it holds
// the user cgroup's process limit (every pid of it taken: nothing new can
// start there); then the owner kills it through envd (SIGKILL ends the command's
// whole tree) and the result is how long after the kill the owner's `echo
// ok` succeeds again. Each stage gives up after deadline; each echo waits
// at most perCall.
func RecoverFromForkBomb(ctx context.Context, c *wire.Client, sb *wire.Sandbox, deadline, perCall time.Duration) (time.Duration, error) {
	const tag = "fork-bomb"
	bctx, cancel := context.WithCancel(ctx)
	defer cancel()
	bombDone := make(chan struct{})
	go func() {
		defer close(bombDone)
		_, _ = c.RunTagged(bctx, sb, "root", ForkBomb, tag)
	}()
	echo := func() error {
		cctx, cancel := context.WithTimeout(ctx, perCall)
		defer cancel()
		res, err := c.Run(cctx, sb, "", "echo ok")
		switch {
		case err != nil:
			return err
		case strings.TrimSpace(res.Stdout) != "ok":
			return fmt.Errorf("echo ok: exit %d, stdout %q, stderr %q", res.ExitCode, res.Stdout, res.Stderr)
		}
		return nil
	}
	pace := func() error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
			return nil
		}
	}
	// The bomb holds the user cgroup once (nearly) every pid of it is
	// taken. envd then starts the owner's commands in its reserve, so the
	// owner's reading of the cgroup answers; a reading that fails means
	// the bomb holds the owner's commands too.
	filled := func() bool {
		cctx, cancel := context.WithTimeout(ctx, perCall)
		defer cancel()
		res, err := c.Run(cctx, sb, "root", userPidsCmd)
		if err != nil {
			return true
		}
		f := strings.Fields(res.Stdout)
		if len(f) != 2 {
			return false
		}
		cur, err1 := strconv.Atoi(f[0])
		limit, err2 := strconv.Atoi(f[1])
		return err1 == nil && err2 == nil && cur >= limit-16
	}
	start := time.Now()
	for {
		if filled() {
			break
		}
		if time.Since(start) > deadline {
			return 0, fmt.Errorf("%w: its echo answered throughout %s of the bomb", ErrNeverBlocked, deadline)
		}
		if err := pace(); err != nil {
			return 0, err
		}
	}
	// Meanwhile the owner moves files, in parallel: envd needs threads for
	// that, which (the bomb holding every other process slot) only its
	// reserve gives it; a Go program that cannot make one ends, and envd
	// is the sandbox's init. Whether the reads finish in time on the CPU
	// the bomb leaves is not the point: an envd gone fails the kill below.
	var wg sync.WaitGroup
	for range parallelReads {
		wg.Go(func() {
			dctx, cancel := context.WithTimeout(ctx, perCall)
			defer cancel()
			_, _ = c.Download(dctx, sb, runtime.EnvdPathInSandbox, io.Discard)
		})
	}
	wg.Wait()
	start = time.Now()
	for {
		kctx, cancel := context.WithTimeout(ctx, perCall)
		err := c.Signal(kctx, sb, tag, true)
		cancel()
		if err == nil || ended(bombDone) {
			break // killed, or already ended (gVisor's host memory guard kills a bomb)
		}
		if time.Since(start) > deadline {
			return 0, fmt.Errorf("the owner could not kill the fork bomb within %s: %w", deadline, err)
		}
		if err := pace(); err != nil {
			return 0, err
		}
	}
	killed := time.Now()
	var last error
	for time.Since(killed) < deadline {
		if last = echo(); last == nil {
			return time.Since(killed), nil
		}
		if err := pace(); err != nil {
			return 0, err
		}
	}
	return 0, fmt.Errorf("no echo of the owner succeeded within %s of killing the fork bomb: %w", deadline, last)
}

// ended reports whether done is closed.
func ended(done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	default:
		return false
	}
}
