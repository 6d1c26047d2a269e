package metrics

import (
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// DefaultMaxSandboxSeries caps the sandboxes that get per-sandbox series.
const DefaultMaxSandboxSeries = 500

// SetMaxSandboxSeries caps the per-sandbox series at n sandboxes (the
// first n by id); the rest are counted in agentbox_sandbox_series_omitted.
// 0 turns per-sandbox series off. Call before serving.
func (m *Metrics) SetMaxSandboxSeries(n int) { m.perSandbox.max = n }

// EgressDone implements egress.Observer.
func (m *Metrics) EgressDone(d egress.Decision) {
	decision := "deny"
	if d.Allowed {
		decision = "allow"
	}
	m.egressDecisions.WithLabelValues(decision, d.Reason).Inc()
	m.egressBytes.WithLabelValues("out").Add(float64(d.Sent))
	m.egressBytes.WithLabelValues("in").Add(float64(d.Received))
	m.perSandbox.addNet(d)
}

// BuildDone records one finished template build.
func (m *Metrics) BuildDone(ok bool, took time.Duration) {
	m.builds.WithLabelValues(result(ok)).Observe(took.Seconds())
}

// sandboxCollector exports per-sandbox figures at scrape time, labelled by
// sandbox id and team id only (never metadata or names a tenant chose),
// for at most max sandboxes.
type sandboxCollector struct {
	src                          Source
	max                          int
	cpu, mem, disk, net, omitted *prometheus.Desc

	mu    sync.Mutex
	bytes map[string]*netBytes // by sandbox id; at most 2*max entries
}

type netBytes struct {
	team    string
	out, in float64
}

func newSandboxCollector(src Source) *sandboxCollector {
	l := []string{"sandbox", "team"}
	return &sandboxCollector{
		src: src, max: DefaultMaxSandboxSeries, bytes: map[string]*netBytes{},
		cpu:     prometheus.NewDesc("agentbox_sandbox_cpu_seconds_total", "CPU time a running sandbox used, from its cgroup.", l, nil),
		mem:     prometheus.NewDesc("agentbox_sandbox_memory_bytes", "Memory a running sandbox uses, page cache excluded.", l, nil),
		disk:    prometheus.NewDesc("agentbox_sandbox_disk_bytes", "Bytes in a running sandbox's writable layer.", l, nil),
		net:     prometheus.NewDesc("agentbox_sandbox_network_bytes_total", "Bytes a running sandbox moved through the egress proxy, by direction (out: to the destination).", append(l, "direction"), nil),
		omitted: prometheus.NewDesc("agentbox_sandbox_series_omitted", "Running sandboxes left out of the per-sandbox series at this scrape (over --metrics-max-sandboxes).", nil, nil),
	}
}

func (c *sandboxCollector) addNet(d egress.Decision) {
	if c.max <= 0 || d.SandboxID == "" || d.Sent+d.Received == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.bytes[d.SandboxID]
	if b == nil {
		if len(c.bytes) >= 2*c.max {
			return // pruned at the next scrape
		}
		b = &netBytes{team: d.TeamID}
		c.bytes[d.SandboxID] = b
	}
	b.out += float64(d.Sent)
	b.in += float64(d.Received)
}

func (c *sandboxCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.cpu, c.mem, c.disk, c.net, c.omitted} {
		ch <- d
	}
}

func (c *sandboxCollector) Collect(ch chan<- prometheus.Metric) {
	if c.max <= 0 {
		return
	}
	all := c.src.LatestSamples()
	slices.SortFunc(all, func(a, b sandbox.Latest) int { return strings.Compare(a.ID, b.ID) })
	shown := all[:min(len(all), c.max)]
	ch <- prometheus.MustNewConstMetric(c.omitted, prometheus.GaugeValue, float64(len(all)-len(shown)))
	live := make(map[string]bool, len(all))
	for _, s := range all {
		live[s.ID] = true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for id := range c.bytes {
		if !live[id] {
			delete(c.bytes, id)
		}
	}
	for _, s := range shown {
		if s.Sampled {
			ch <- prometheus.MustNewConstMetric(c.cpu, prometheus.CounterValue, s.CPUSeconds, s.ID, s.TeamID)
			ch <- prometheus.MustNewConstMetric(c.mem, prometheus.GaugeValue, float64(s.MemUsed), s.ID, s.TeamID)
			ch <- prometheus.MustNewConstMetric(c.disk, prometheus.GaugeValue, float64(s.DiskUsed), s.ID, s.TeamID)
		}
		b := c.bytes[s.ID]
		if b == nil {
			b = &netBytes{}
		}
		ch <- prometheus.MustNewConstMetric(c.net, prometheus.CounterValue, b.out, s.ID, s.TeamID, "out")
		ch <- prometheus.MustNewConstMetric(c.net, prometheus.CounterValue, b.in, s.ID, s.TeamID, "in")
	}
}
