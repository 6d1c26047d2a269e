package main

import (
	"time"

	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/metrics"
	"github.com/agentbox/agentbox/internal/usage"
)

// egressFanout hands each egress decision to the metrics and the usage
// meter.
type egressFanout struct {
	mets  *metrics.Metrics
	meter *usage.Meter
}

func (f egressFanout) EgressDone(d egress.Decision) {
	f.mets.EgressDone(d)
	f.meter.Egress(d.TeamID, d.SandboxID, d.Sent+d.Received, time.Now())
}
