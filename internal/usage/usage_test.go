package usage

import (
	"context"
	"log/slog"
	"math"
	"sync"
	"testing"
	"time"
)

func TestAccrue(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	run := func(at time.Duration, cpu, mem, disk uint64) Observation {
		return Observation{Kind: KindSandbox, ID: "s", TeamID: "a", At: t0.Add(at), Running: true, CPUNanos: cpu, MemBytes: mem, DiskBytes: disk}
	}
	paused := func(at time.Duration, disk uint64) Observation {
		return Observation{Kind: KindSandbox, ID: "s", TeamID: "a", At: t0.Add(at), DiskBytes: disk}
	}
	for _, tc := range []struct {
		name      string
		prev, cur Observation
		want      Amount
	}{
		{"running", run(0, 1e9, gib, gib), run(10*time.Second, 3e9, gib, gib), Amount{CPUSeconds: 2, MemoryGiBSeconds: 10, DiskGiBHours: 10.0 / 3600}},
		{"memory averaged", run(0, 0, 0, 0), run(4*time.Second, 0, 2*gib, 0), Amount{MemoryGiBSeconds: 4}},
		{"paused: disk only", paused(0, 2*gib), paused(time.Hour, 2*gib), Amount{DiskGiBHours: 2}},
		{"pausing: no cpu or memory", run(0, 1e9, gib, gib), paused(time.Hour, gib), Amount{DiskGiBHours: 1}},
		{"resuming: no cpu or memory", paused(0, gib), run(time.Hour, 5e9, gib, gib), Amount{DiskGiBHours: 1}},
		{"counter reset counts from zero", run(0, 9e9, 0, 0), run(time.Second, 1e9, 0, 0), Amount{CPUSeconds: 1}},
		{"first observation", Observation{}, run(time.Second, 1e9, gib, gib), Amount{}},
		{"gap too long", run(0, 0, gib, gib), run(time.Hour+time.Second, 1e9, gib, gib), Amount{}},
		{"not forward", run(time.Second, 0, gib, gib), run(time.Second, 1e9, gib, gib), Amount{}},
		{"claimed by another team", run(0, 0, gib, gib), func() Observation { o := run(time.Second, 1e9, gib, gib); o.TeamID = "b"; return o }(), Amount{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Accrue(tc.prev, tc.cur, time.Hour)
			if !near(got, tc.want) {
				t.Errorf("Accrue = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func near(a, b Amount) bool {
	eq := func(x, y float64) bool { return math.Abs(x-y) < 1e-9 }
	return eq(a.CPUSeconds, b.CPUSeconds) && eq(a.MemoryGiBSeconds, b.MemoryGiBSeconds) && eq(a.DiskGiBHours, b.DiskGiBHours) && a.EgressBytes == b.EgressBytes
}

type memStore struct {
	mu   sync.Mutex
	rows map[Key]Amount
	tpl  map[Key]string
}

func (s *memStore) AddUsage(_ context.Context, rows []Row) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range rows {
		a := s.rows[r.Key]
		a.add(r.Amount)
		s.rows[r.Key] = a
		s.tpl[r.Key] = r.TemplateID
	}
	return nil
}

func TestMeterPausedAccruesDiskOnly(t *testing.T) {
	st := &memStore{rows: map[Key]Amount{}, tpl: map[Key]string{}}
	m := NewMeter(st, time.Minute, slog.New(slog.DiscardHandler))
	t0 := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	o := Observation{Kind: KindSandbox, ID: "s", TeamID: "a", TemplateID: "base", Running: true}
	at := func(d time.Duration, running bool, cpu uint64) Observation {
		o := o
		o.At, o.Running = t0.Add(d), running
		if running {
			o.CPUNanos, o.MemBytes, o.DiskBytes = cpu, gib, gib
		}
		return o
	}
	ctx := context.Background()
	m.Observe(ctx, []Observation{at(0, true, 0)})
	m.Observe(ctx, []Observation{at(time.Minute, true, 30e9)})
	// Paused for five minutes: the disk size carries over from the last
	// running observation.
	for i := 2; i <= 6; i++ {
		m.Observe(ctx, []Observation{at(time.Duration(i)*time.Minute, false, 0)})
	}
	m.Egress("a", "s", 1000, t0.Add(6*time.Minute))
	m.Flush(ctx)
	k := Key{TeamID: "a", Kind: KindSandbox, ID: "s", Hour: t0}
	got := st.rows[k]
	want := Amount{CPUSeconds: 30, MemoryGiBSeconds: 60, DiskGiBHours: 6.0 / 60, EgressBytes: 1000}
	if !near(got, want) {
		t.Errorf("stored %+v, want %+v", got, want)
	}
	if st.tpl[k] != "base" {
		t.Errorf("template %q, want base", st.tpl[k])
	}
	// A sandbox that is no longer observed is forgotten: the same id later
	// starts from a fresh baseline instead of accruing the gap.
	m.Observe(ctx, nil)
	m.Observe(ctx, []Observation{at(7*time.Minute, true, 90e9)})
	m.Flush(ctx)
	if got := st.rows[k]; got.CPUSeconds != 30 {
		t.Errorf("after a gap: cpu %v, want still 30", got.CPUSeconds)
	}
}

// A sandbox that started while the meter ran counts from its start, so a
// burst before its first tick is not lost; one that started before (the
// server restarted) counts only from its first observation.
func TestMeterFirstObservation(t *testing.T) {
	for _, tc := range []struct {
		name  string
		since time.Duration // relative to the meter's start
		cpu   float64
	}{
		{"started under this meter", time.Second, 3},
		{"started before it", -time.Hour, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := &memStore{rows: map[Key]Amount{}, tpl: map[Key]string{}}
			m := NewMeter(st, time.Minute, slog.New(slog.DiscardHandler))
			since := m.started.Add(tc.since)
			m.Observe(context.Background(), []Observation{{Kind: KindSandbox, ID: "s", TeamID: "a", Running: true,
				Since: since, At: m.started.Add(2 * time.Second), CPUNanos: 3e9, MemBytes: gib}})
			var cpu float64
			for _, a := range st.rows {
				cpu += a.CPUSeconds
			}
			if cpu != tc.cpu {
				t.Errorf("cpu %v, want %v", cpu, tc.cpu)
			}
		})
	}
}
