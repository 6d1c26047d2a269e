package main

import "github.com/agentbox/agentbox/internal/sandbox"

// metricSource is what the metrics collectors read: the manager's state
// counts and samples, and its warm pools.
type metricSource struct{ *sandbox.Manager }

func (s metricSource) Pools() []sandbox.PoolStats { return s.Manager.Pools().List() }
