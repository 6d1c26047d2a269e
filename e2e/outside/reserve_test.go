package outside

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/agentbox/agentbox/bench/benchmark"
	"github.com/agentbox/agentbox/e2e/wire"
)

// sideSandboxOwner: code inside a sandbox, as root, against its own
// owner's control of it (envd's process API).
const sideSandboxOwner = "sandbox→owner"

// TestControlPlaneReserve: code in a sandbox runs a fork bomb until its
// owner kills it, or a memory thrash past the sandbox's memory limit for a
// few seconds; the owner's kill and next command through envd succeed
// within a generous deadline (a bound on the outcome, not a measure: the
// bench reports the figure). envd keeps a reserve of pids and memory that
// the user's processes cannot take (internal/runtime/bundle/usercgroup.go).
func TestControlPlaneReserve(t *testing.T) {
	s := server(t)
	c := wire.New(s.URL, s.APIKey)
	const secs, deadline, perCall = 5, 15 * time.Second, 10 * time.Second
	var thrash benchmark.Abuse
	for _, a := range benchmark.Abuses() {
		if a.Name == "memory thrash" {
			thrash = a
		}
	}
	var attacks []attack
	for _, tier := range []struct{ name, isolation string }{{"runc", "container"}, {"gVisor", "gvisor"}} {
		for _, abuse := range []struct {
			name     string
			forkBomb bool
			recover  func(ctx context.Context, sb *wire.Sandbox) (time.Duration, error)
		}{
			{fmt.Sprintf("fork bomb on %s keeps its owner from killing it and running a command for %s", tier.name, deadline), true,
				func(ctx context.Context, sb *wire.Sandbox) (time.Duration, error) {
					return benchmark.RecoverFromForkBomb(ctx, c, sb, deadline, perCall)
				}},
			{fmt.Sprintf("%d s memory thrash on %s keeps its owner from running a command for %s", secs, tier.name, deadline), false,
				func(ctx context.Context, sb *wire.Sandbox) (time.Duration, error) {
					return benchmark.OwnerRecovery(ctx, c, sb, thrash, secs, deadline, perCall)
				}},
		} {
			attacks = append(attacks, attack{
				side: sideSandboxOwner,
				name: abuse.name,
				run: func(t *testing.T) error {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
					defer cancel()
					sb, err := c.Create(ctx, wire.CreateRequest{TemplateID: "base", Timeout: 300, Metadata: map[string]string{"outside": "reserve", "agentbox.isolation": tier.isolation}})
					if err != nil {
						t.Fatalf("create %s sandbox: %v", tier.name, err)
					}
					defer func() { _ = c.Kill(context.Background(), sb.SandboxID) }()
					r, err := c.Run(ctx, sb, "", "grep -E 'pids|memory' /proc/self/cgroup")
					if err != nil || r.ExitCode != 0 {
						t.Fatalf("the owner's command fails before any abuse: %+v %v", r, err)
					}
					t.Logf("a command's cgroups on %s: %s", tier.name, oneLine(r.Stdout))
					recover := abuse.recover
					if tier.isolation == "gvisor" && abuse.forkBomb {
						// The host memory guard kills the bomb before
						// the host's OOM killer ends the sentry
						// (hostguard_test.go).
						recover = func(ctx context.Context, sb *wire.Sandbox) (time.Duration, error) {
							return recoverFromGVisorBomb(ctx, c, s, sb, deadline, perCall)
						}
					}
					took, err := recover(ctx, sb)
					if err != nil {
						return crossed("%v", err)
					}
					t.Logf("%s: the owner's echo ran again %s after", abuse.name, took.Round(time.Millisecond))
					return nil
				},
			})
		}
	}
	runAttacks(t, attacks)
}
