package sandbox

import (
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/runtime"
)

func TestIdleStateFreezeIfIdle(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		name     string
		last     time.Duration // before now
		inflight bool
		frozen   bool
		want     bool
	}{
		{"idle long enough", 2 * time.Minute, false, false, true},
		{"recent traffic", 10 * time.Second, false, false, false},
		{"request in flight", 2 * time.Minute, true, false, false},
		{"already frozen", 2 * time.Minute, false, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newIdleState()
			s.activity["a"] = &activity{last: now.Add(-tc.last), frozen: tc.frozen}
			if tc.inflight {
				defer s.request("a")()
			}
			if got := s.freezeIfIdle("a", now, time.Minute); got != tc.want {
				t.Fatalf("freezeIfIdle = %v, want %v", got, tc.want)
			}
			if s.frozen("a") != (tc.want || tc.frozen) {
				t.Fatalf("frozen = %v", s.frozen("a"))
			}
		})
	}
}

func TestIdleStateEndedCancelsLife(t *testing.T) {
	s := newIdleState()
	life := s.life("a")
	done := s.request("a")
	done()
	if _, inflight := s.idle("a", time.Now()); inflight {
		t.Fatal("request still in flight after done")
	}
	s.forget("a") // a pause keeps the life
	if life.ctx.Err() != nil {
		t.Fatal("life ended by a pause")
	}
	s.ended("a")
	if life.ctx.Err() == nil || len(s.gone) != 0 || s.activity["a"] != nil {
		t.Fatalf("ended kept state: ctx %v gone %v", life.ctx.Err(), s.gone)
	}
}

func TestSamplesCPUPercentAndForget(t *testing.T) {
	s := newSamples()
	sb := &Sandbox{ID: "a", CPUCount: 2, MemoryMB: 512}
	t0 := time.Now()
	s.record(sb, runtime.Stats{Timestamp: t0})
	pt := s.record(sb, runtime.Stats{Timestamp: t0.Add(time.Second), CPUUsageNanos: uint64(time.Second)})
	if pt.CPUUsedPct != 50 || pt.MemTotal != 512<<20 {
		t.Fatalf("sample %+v; want 50%% of 2 CPUs and the 512 MiB limit", pt)
	}
	if got := s.between("a", t0.Add(time.Millisecond), time.Time{}); len(got) != 1 {
		t.Fatalf("between: %d samples, want 1", len(got))
	}
	s.forget("a")
	if !s.empty("a") {
		t.Fatal("samples kept after forget")
	}
}
