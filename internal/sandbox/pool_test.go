package sandbox

import (
	"context"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"
)

// The adaptive size: the minimum when quiet, the largest recent burst
// (or the steady rate's need while one sandbox refills) on top of it, and
// never over the cap.
func TestPoolTarget(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	burst := func(n int, at time.Duration, spread time.Duration) []time.Time {
		out := make([]time.Time, n)
		for i := range out {
			out[i] = t0.Add(at + time.Duration(i)*spread/time.Duration(n))
		}
		return out
	}
	steady := func(perSecond int, seconds int) []time.Time {
		return burst(perSecond*seconds, 0, time.Duration(seconds)*time.Second)
	}
	for _, tc := range []struct {
		name          string
		minSize, cap_ int
		creates       []time.Time
		want          int
	}{
		{"quiet", 2, 16, nil, 2},
		{"quiet, no minimum", 0, 16, nil, 0},
		{"one create", 2, 16, burst(1, 0, 0), 3},
		{"burst of 100 within a second", 2, 200, burst(100, 0, time.Second), 102},
		{"burst of 100 capped", 2, 50, burst(100, 0, time.Second), 50},
		{"burst spread over 20 s counts its densest 2 s", 0, 200, burst(100, 0, 20*time.Second), 10},
		{"two bursts: the larger counts", 0, 200, append(burst(10, 0, time.Second), burst(30, 30*time.Second, time.Second)...), 30},
		{"steady 1/s for a minute: the densest refill time", 0, 200, steady(1, 60), 2},
		{"steady 2/s for five minutes: rate term", 0, 2000, steady(2, 300), 8},
		{"cap below minimum keeps the minimum", 8, 4, burst(100, 0, time.Second), 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := poolTarget(tc.minSize, tc.cap_, tc.creates); got != tc.want {
				t.Errorf("poolTarget(%d, %d, %d creates) = %d, want %d", tc.minSize, tc.cap_, len(tc.creates), got, tc.want)
			}
		})
	}
}

// A warm pool grows after a burst to absorb the next one whole, and
// shrinks back to its minimum once the burst has left its window; the
// sandboxes it trims are removed, nothing of them left.
func TestWarmPoolAdapts(t *testing.T) {
	ctx := context.Background()
	e := newFakeEnv(t, LifecycleConfig{Pools: map[string]int{"base": 1}, PoolMax: 12})
	pool := func() PoolStats {
		ps := e.m.Pools().List()
		if len(ps) != 1 {
			t.Fatalf("pools %+v, want one", ps)
		}
		return ps[0]
	}
	// fillTo ticks the pool at now until it holds want ready sandboxes.
	fillTo := func(now time.Time, want int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			e.m.reaper.poolTick(ctx, now)
			if p := pool(); p.Ready == want && p.Filling == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("pool never reached %d ready: %+v", want, pool())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	burst := func(n int) []string {
		ids := make([]string, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { ids[i] = e.create(t, e.req()).ID })
		}
		wg.Wait()
		return ids
	}
	e.m.reaper.poolTick(ctx, time.Now())
	fillTo(time.Now(), 1)

	first := burst(10)
	if p := pool(); p.Hits != 1 || p.Misses != 9 {
		t.Fatalf("first burst: %+v, want 1 hit and 9 cold starts", p)
	}
	fillTo(time.Now(), 11)
	if p := pool(); p.Target != 11 {
		t.Fatalf("target after a burst of 10 = %d, want 11 (minimum 1 + 10)", p.Target)
	}
	second := burst(10)
	if p := pool(); p.Hits != 11 || p.Misses != 9 {
		t.Fatalf("second burst: %+v, want all 10 claimed warm", p)
	}
	// The cap bounds the growth: 20 creates in one refill time, cap 12.
	fillTo(time.Now(), 12)

	// A quiet window later the pool is back at its minimum.
	later := time.Now().Add(2 * poolWindow)
	fillTo(later, 1)
	if p := pool(); p.Target != 1 {
		t.Fatalf("target after a quiet window = %d, want 1", p.Target)
	}
	var keep []string
	e.m.mu.Lock()
	for id, sb := range e.m.sandboxes {
		if sb.TeamID == poolTeam && sb.State == StateRunning {
			keep = append(keep, id)
		}
	}
	e.m.mu.Unlock()
	for _, id := range append(first, second...) {
		if err := e.m.Kill(ctx, e.team, id); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(e.h.Leaks()) != 2*len(keep) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	e.noLeaks(t, keep...)
}

// A warm claim does not wait for a create slot: with every slot held by
// cold starts it still completes at once.
func TestWarmClaimTakesNoCreateSlot(t *testing.T) {
	ctx := context.Background()
	e := newFakeEnv(t, LifecycleConfig{Pools: map[string]int{"base": 1}})
	deadline := time.Now().Add(5 * time.Second)
	for e.m.reaper.poolTick(ctx, time.Now()); len(e.m.Pools().List()) == 0 || e.m.Pools().List()[0].Ready < 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("pool never filled: %+v", e.m.Pools().List())
		}
	}
	for range createSlots(runtime.GOMAXPROCS(0)) {
		release, err := e.m.admission.createSlot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer release()
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	sb, err := e.m.Create(cctx, e.req())
	if err != nil {
		t.Fatalf("claim with every create slot taken: %v", err)
	}
	if p := e.m.Pools().List()[0]; p.Hits != 1 {
		t.Fatalf("created %s cold, want a warm claim: %+v", sb.ID, p)
	}
}

// A warm sandbox the health check found broken is never claimed (the
// create starts cold at once instead of waiting for its envd), and the
// pool replaces it.
func TestWarmPoolSkipsUnhealthy(t *testing.T) {
	ctx := context.Background()
	e := newFakeEnv(t, LifecycleConfig{Pools: map[string]int{"base": 1}})
	waitReady := func() string {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			e.m.reaper.poolTick(ctx, time.Now())
			e.m.mu.Lock()
			for id, sb := range e.m.sandboxes {
				if sb.TeamID == poolTeam && sb.State == StateRunning && sb.Health == "" {
					e.m.mu.Unlock()
					return id
				}
			}
			e.m.mu.Unlock()
			if time.Now().After(deadline) {
				t.Fatalf("pool never filled: %+v", e.m.Pools().List())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	broken := waitReady()
	e.m.mu.Lock()
	e.m.sandboxes[broken].Health, e.m.sandboxes[broken].HealthReason = "error", "envd does not answer"
	e.m.mu.Unlock()
	if p := e.m.Pools().List()[0]; p.Ready != 0 {
		t.Fatalf("an unhealthy warm sandbox counts as ready: %+v", p)
	}
	sb := e.create(t, e.req())
	if sb.ID == broken {
		t.Fatalf("claimed the unhealthy warm sandbox %s", broken)
	}
	if fresh := waitReady(); fresh == broken {
		t.Fatalf("the pool kept its unhealthy sandbox %s", broken)
	}
	deadline := time.Now().Add(5 * time.Second)
	for slices.Contains(e.h.Leaks(), "container "+broken) {
		if time.Now().After(deadline) {
			t.Fatalf("unhealthy warm sandbox %s never removed: %v", broken, e.h.Leaks())
		}
		time.Sleep(5 * time.Millisecond)
	}
}
