package outside

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/wire"
)

// detachedBomb is a fork bomb that outlives the command that starts it:
// the command returns at once, so its owner has no handle to kill it with
// and must start a command of their own to stop it.
const detachedBomb = `nohup bash -c 'f(){ f|f & }; f' >/dev/null 2>&1 & echo started`

// userPids reads the user cgroup's pids.current and pids.max (cgroup v1,
// the container tier's sandbox view).
const userPids = `cat /sys/fs/cgroup/pids/user/pids.current /sys/fs/cgroup/pids/user/pids.max`

// TestDetachedForkBomb: code in a sandbox starts a fork bomb that detaches
// from its command and fills every pid the user cgroup has. Its owner must
// still start a command that kills it (a command starts in envd's reserve
// when the user cgroup is full), and then run commands as before.
func TestDetachedForkBomb(t *testing.T) {
	s := server(t)
	c := wire.New(s.URL, s.APIKey)
	const deadline, perCall = 60 * time.Second, 20 * time.Second
	runAttacks(t, []attack{{
		side: sideSandboxOwner,
		name: fmt.Sprintf("a detached fork bomb on runc keeps its owner from killing it within %s", deadline),
		run: func(t *testing.T) error {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			sb, err := c.Create(ctx, wire.CreateRequest{TemplateID: "base", Timeout: 300, Metadata: map[string]string{"outside": "detached-bomb"},
				// A small limit: the bomb fills it as surely, with a tenth
				// of the tasks to spin on the cores other suites share.
				PIDs: 512})
			if err != nil {
				t.Fatalf("create sandbox: %v", err)
			}
			defer func() { _ = c.Kill(context.Background(), sb.SandboxID) }()
			run := func(user, cmd string) (*wire.Result, error) {
				cctx, cancel := context.WithTimeout(ctx, perCall)
				defer cancel()
				return c.Run(cctx, sb, user, cmd)
			}
			pids := func() (cur, limit int, err error) {
				r, err := run("root", userPids)
				if err != nil {
					return 0, 0, err
				}
				f := strings.Fields(r.Stdout)
				if len(f) != 2 {
					return 0, 0, fmt.Errorf("%s: %q %q", userPids, r.Stdout, r.Stderr)
				}
				cur, _ = strconv.Atoi(f[0])
				limit, err = strconv.Atoi(f[1])
				return cur, limit, err
			}
			if _, limit, err := pids(); err != nil || limit <= 0 {
				t.Fatalf("the sandbox has no user cgroup with a pids limit: %d %v", limit, err)
			}
			if r, err := run("", detachedBomb); err != nil || !strings.Contains(r.Stdout, "started") {
				t.Fatalf("start the bomb: %+v %v", r, err)
			}
			// Wait for the state: the bomb holds (nearly) every pid of
			// the user cgroup. Reading it is itself the owner's command.
			start := time.Now()
			for {
				// A reading that fails while the bomb spreads is retried:
				// whether the owner keeps control is judged by the kill
				// below, which must succeed within the deadline.
				cur, limit, err := pids()
				if err == nil && cur >= limit-4 {
					break
				}
				if time.Since(start) > deadline {
					if err != nil {
						return crossed("the owner cannot read the user cgroup while the bomb fills it: %v", err)
					}
					t.Fatalf("the bomb did not fill the user cgroup in %s (%d of %d)", deadline, cur, limit)
				}
				time.Sleep(200 * time.Millisecond)
			}
			// The owner kills every process of the bomb's user (kill(-1)
			// as that user: one call, no scan of thousands of processes
			// on a CPU the bomb saturates) until the user cgroup is nearly
			// empty.
			start = time.Now()
			var last error
			for {
				if time.Since(start) > deadline {
					return crossed("the owner could not stop the detached bomb within %s: %v", deadline, last)
				}
				r, err := run("", `kill -9 -1 2>/dev/null; kill -9 -1 2>/dev/null; cat /sys/fs/cgroup/pids/user/pids.current`)
				if err != nil {
					last = err
					time.Sleep(200 * time.Millisecond)
					continue
				}
				if n, err := strconv.Atoi(strings.TrimSpace(r.Stdout)); err == nil && n < 8 {
					break
				}
				last = fmt.Errorf("processes left in the user cgroup: %q", strings.TrimSpace(r.Stdout))
			}
			r, err := run("", "echo ok")
			if err != nil || strings.TrimSpace(r.Stdout) != "ok" {
				return crossed("the owner's command after the bomb: %+v %v", r, err)
			}
			t.Logf("the detached bomb was stopped %s after it filled the user cgroup", time.Since(start).Round(time.Millisecond))
			return nil
		},
	}})
}
