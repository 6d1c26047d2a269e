package sandbox

import (
	"context"
	"testing"
	"time"
)

// TestHealthEndsStreamsOfDeadSandbox: a health pass that finds a sandbox's
// container stopped ends the traffic in flight to it (a stream would
// otherwise wait on a peer that can no longer answer) and reports it; a
// sandbox whose container runs keeps its streams.
func TestHealthEndsStreamsOfDeadSandbox(t *testing.T) {
	for _, tc := range []struct {
		name  string
		stop  bool
		ended bool
	}{
		{"container stopped", true, true},
		{"container running", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			e := newFakeEnv(t, LifecycleConfig{})
			sb := e.create(t, e.req())
			_, live, done, ok := e.m.WakeIf(ctx, sb.ID, nil)
			if !ok {
				t.Fatal("no traffic to a running sandbox")
			}
			defer done()
			if tc.stop {
				e.h.Runtime.Stop(sb.ID)
			}
			e.m.health.check(ctx)
			if tc.ended {
				select { // the end reaches the stream asynchronously
				case <-live.Done():
				case <-time.After(10 * time.Second):
					t.Fatal("the stream to a dead sandbox did not end")
				}
			} else if live.Err() != nil {
				t.Fatal("the stream to a running sandbox was ended")
			}
			got, err := e.m.Get(ctx, e.team, sb.ID)
			if err != nil {
				t.Fatal(err)
			}
			if (got.Health == HealthError) != tc.stop {
				t.Fatalf("health %q (%q) after the pass", got.Health, got.HealthReason)
			}
			// The owner can kill it, and its resources go with it.
			if err := e.m.Kill(ctx, e.team, sb.ID); err != nil {
				t.Fatal(err)
			}
			e.noLeaks(t)
		})
	}
}
