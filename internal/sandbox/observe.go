package sandbox

import (
	"time"
)

// Observer receives the manager's measurements; internal/metrics exports
// them to Prometheus. Calls are synchronous and must be cheap.
type Observer interface {
	// Created is one run of a start pipeline (path: create, claim,
	// restore, fork, resume, build...), with each step's duration.
	Created(path, isolation, template string, ok bool, total time.Duration, steps map[string]time.Duration)
	// Lifecycle is one pause, resume, snapshot or fork call.
	Lifecycle(op string, ok bool, took time.Duration)
}

type noObserver struct{}

func (noObserver) Created(string, string, string, bool, time.Duration, map[string]time.Duration) {}
func (noObserver) Lifecycle(string, bool, time.Duration)                                         {}

// StateCount is how many sandboxes are in one state on one tier.
type StateCount struct {
	State     State
	Isolation string
	Count     int
}

// StateCounts counts every sandbox the manager holds (warm pool members and
// build sandboxes included) by state and tier.
func (m *Manager) StateCounts() []StateCount {
	type key struct {
		state State
		iso   string
	}
	counts := map[key]int{}
	m.mu.Lock()
	for _, sb := range m.sandboxes {
		iso := sb.Isolation
		if iso == "" {
			iso = IsolationContainer
		}
		counts[key{sb.State, iso}]++
	}
	m.mu.Unlock()
	out := make([]StateCount, 0, len(counts))
	for k, n := range counts {
		out = append(out, StateCount{State: k.state, Isolation: k.iso, Count: n})
	}
	return out
}

// opName names a lifecycle operation: "pause" with memory, "pause_files"
// without.
func opName(op string, memory bool) string {
	if memory {
		return op
	}
	return op + "_files"
}
