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

// opName names a lifecycle operation: "pause" with memory, "pause_files"
// without.
func opName(op string, memory bool) string {
	if memory {
		return op
	}
	return op + "_files"
}
