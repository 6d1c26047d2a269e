package main

import "github.com/agentbox/agentbox/internal/sandbox"

// metricSource is what the metrics collectors read: the manager's state
// counts and samples, and its warm pools. mgr is set once the manager is
// made (it reports to the metrics), before the first scrape.
type metricSource struct{ mgr *sandbox.Manager }

func (s *metricSource) StateCounts() []sandbox.StateCount { return s.mgr.Sampler().StateCounts() }

func (s *metricSource) LatestSamples() []sandbox.Latest { return s.mgr.Sampler().LatestSamples() }

func (s *metricSource) Pools() []sandbox.PoolStats { return s.mgr.Pools().List() }
