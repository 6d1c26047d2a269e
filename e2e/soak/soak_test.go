// Package soak runs the mixed soak workload briefly against a server of its
// own and checks that, once the workload's objects are gone, the server and
// its host objects are back where they started.
package soak

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/agentbox/agentbox/bench/benchmark"
	"github.com/agentbox/agentbox/e2e/harness"
)

// soakOps is the CI length; AGENTBOX_SOAK_OPS runs a longer one.
func soakOps(t *testing.T) int {
	if v := os.Getenv("AGENTBOX_SOAK_OPS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("AGENTBOX_SOAK_OPS=%q: want a positive number", v)
		}
		return n
	}
	return 200
}

// TestSoakLeavesNothing: a few hundred operations of the mixed cycle by
// three teams; afterwards every mount, pinned netns, veth, loop device and
// cgroup of the server is gone, and its open files and goroutines are back
// within a few of their baseline.
func TestSoakLeavesNothing(t *testing.T) {
	const token = "soak-metrics-token"
	s := harness.Start(t, harness.Name("soak"), harness.Args("--metrics-token", token))
	keys := []string{s.APIKey, s.NewKey(t, "soak-b"), s.NewKey(t, "soak-c")}
	scope := hostScope(t, s, token)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	res, err := benchmark.Soak(ctx, benchmark.SoakConfig{APIURL: s.URL, Keys: keys, Ops: soakOps(t), Workers: 2, Host: scope}, testWriter{t})
	if err != nil {
		t.Fatalf("soak: %v", err)
	}
	total := 0
	for _, n := range res.Failed {
		total += n
	}
	// Operations may fail under load (a pause that times out freezing, say);
	// what the test judges is what is left behind, and that most worked.
	if total > res.Ops/10 {
		t.Errorf("%d of %d operations failed: %v", total, res.Ops, res.FirstErr)
	}
	base := res.Baseline
	var after benchmark.HostSample
	// Kills finish their host cleanup, and the server closes the
	// connections the clients let go, shortly after.
	settled := func(h benchmark.HostSample) bool {
		return h.Objects() == base.Objects() && (base.FDs < 0 || h.FDs <= base.FDs+8) && (base.Goroutines < 0 || h.Goroutines <= base.Goroutines+16)
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		after = scope.Sample()
		if settled(after) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server and its host objects did not return to baseline:\n%s\n%s (baseline)\n%s (after)\nopen files: %v", benchmark.HostHeader(), base, after, openFiles(scope.ServerPID))
		}
		time.Sleep(time.Second)
	}
	t.Logf("%d operations; baseline → after:\n%s\n%s\n%s", res.Ops, benchmark.HostHeader(), base, after)
}

// testWriter prints the soak's samples to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(fmt.Sprintf("%s", p[:len(p)-min(1, len(p))]))
	return len(p), nil
}
