// Package metrics exports the server's measurements in Prometheus format:
// start pipelines by path, tier and template (and by step), lifecycle
// operations, sandboxes by state and the warm pools, egress decisions and
// bytes, template builds, per-sandbox figures (capped), plus the Go runtime
// and process collectors. It owns its registry (nothing global).
package metrics

import (
	"crypto/subtle"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/agentbox/agentbox/internal/sandbox"
)

// Source is what the collectors read at each scrape.
type Source interface {
	StateCounts() []sandbox.StateCount
	Pools() []sandbox.PoolStats
	LatestSamples() []sandbox.Latest
}

// MaxTemplates caps the template label's values: templates beyond it are
// counted as "other", so a team making many templates cannot blow up the
// series count.
const MaxTemplates = 100

// Metrics is the registry and the instruments the server feeds.
type Metrics struct {
	reg       *prometheus.Registry
	create    *prometheus.HistogramVec
	steps     *prometheus.HistogramVec
	lifecycle *prometheus.HistogramVec
	gateway   *prometheus.CounterVec

	egressDecisions *prometheus.CounterVec
	egressBytes     *prometheus.CounterVec
	builds          *prometheus.HistogramVec
	perSandbox      *sandboxCollector

	mu        sync.Mutex
	templates map[string]bool
}

// New returns metrics reading src at each scrape.
func New(src Source) *Metrics {
	// Start pipelines run from milliseconds (a pool claim) to minutes (a
	// cold template); lifecycle operations from tens of milliseconds to
	// minutes.
	createBuckets := []float64{.005, .01, .025, .05, .1, .15, .2, .3, .5, .75, 1, 2, 5, 10, 30, 60}
	stepBuckets := []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 5, 30}
	lifecycleBuckets := []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120}
	m := &Metrics{
		reg:       prometheus.NewRegistry(),
		templates: map[string]bool{},
		create: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "agentbox_sandbox_start_seconds",
			Help:    "Time of a sandbox start pipeline, by path (create, claim, restore, fork, resume, build), isolation tier, template and result.",
			Buckets: createBuckets,
		}, []string{"path", "isolation", "template", "result"}),
		steps: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "agentbox_sandbox_start_step_seconds",
			Help:    "Time of one step of a sandbox start pipeline, by path and step.",
			Buckets: stepBuckets,
		}, []string{"path", "step"}),
		lifecycle: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "agentbox_lifecycle_seconds",
			Help:    "Time of a pause, resume, snapshot or fork (the _files variants keep no memory), by result.",
			Buckets: lifecycleBuckets,
		}, []string{"op", "result"}),
		gateway: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentbox_gateway_requests_total",
			Help: "Requests the data-plane gateway answered, by target (envd, interpreter, port) and status class.",
		}, []string{"target", "code"}),
		egressDecisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentbox_egress_decisions_total",
			Help: "Sandbox connections and proxied requests the egress proxy decided, by decision (allow, deny) and reason class (allow_out, deny_out, default, limit, error, other).",
		}, []string{"decision", "reason"}),
		egressBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentbox_egress_bytes_total",
			Help: "Bytes through the egress proxy, by direction (out: sandbox to destination; in: back), counted when a connection or request ends.",
		}, []string{"direction"}),
		builds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "agentbox_template_build_seconds",
			Help:    "Time of a template build (all its steps), by result.",
			Buckets: []float64{1, 5, 10, 30, 60, 120, 300, 600, 1200, 3600},
		}, []string{"result"}),
		perSandbox: newSandboxCollector(src),
	}
	m.reg.MustRegister(m.create, m.steps, m.lifecycle, m.gateway, m.egressDecisions, m.egressBytes, m.builds, m.perSandbox,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		newStateCollector(src))
	return m
}

// Created implements sandbox.Observer.
func (m *Metrics) Created(path, isolation, template string, ok bool, total time.Duration, steps map[string]time.Duration) {
	if isolation == "" {
		isolation = sandbox.IsolationContainer
	}
	m.create.WithLabelValues(path, isolation, m.templateLabel(template), result(ok)).Observe(total.Seconds())
	for step, d := range steps {
		m.steps.WithLabelValues(path, step).Observe(d.Seconds())
	}
}

// Lifecycle implements sandbox.Observer.
func (m *Metrics) Lifecycle(op string, ok bool, took time.Duration) {
	m.lifecycle.WithLabelValues(op, result(ok)).Observe(took.Seconds())
}

// GatewayRequest counts one answered data-plane request.
func (m *Metrics) GatewayRequest(target string, status int) {
	m.gateway.WithLabelValues(target, codeClass(status)).Inc()
}

func (m *Metrics) templateLabel(t string) string {
	if t == "" {
		return "none"
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.templates[t] {
		return t
	}
	if len(m.templates) >= MaxTemplates {
		return "other"
	}
	m.templates[t] = true
	return t
}

func result(ok bool) string {
	if ok {
		return "ok"
	}
	return "error"
}

func codeClass(status int) string {
	if status < 100 || status > 599 {
		return "other"
	}
	return string(rune('0'+status/100)) + "xx"
}

// Handler serves the registry. token, when set, must come as
// "Authorization: Bearer <token>"; an empty token serves anyone (for a
// listener of its own on a private address).
func (m *Metrics) Handler(token string) http.Handler {
	h := promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
	if token == "" {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="agentbox metrics"`)
			http.Error(w, "metrics need the operator's token: Authorization: Bearer <the server's --metrics-token>", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// stateCollector reports sandboxes by state and the warm pools at scrape
// time, from the manager's memory.
type stateCollector struct {
	src                                      Source
	sandboxes, poolReady, poolTarget, claims *prometheus.Desc
}

func newStateCollector(src Source) *stateCollector {
	return &stateCollector{
		src:        src,
		sandboxes:  prometheus.NewDesc("agentbox_sandboxes", "Sandboxes the server holds, by state and isolation tier (warm pool members and build sandboxes included).", []string{"state", "isolation"}, nil),
		poolReady:  prometheus.NewDesc("agentbox_pool_ready", "Warm sandboxes ready to be claimed, by template.", []string{"template"}, nil),
		poolTarget: prometheus.NewDesc("agentbox_pool_target", "The adaptive size a warm pool aims at, by template.", []string{"template"}, nil),
		claims:     prometheus.NewDesc("agentbox_pool_claims_total", "Creates a warm pool served (hit) or could not serve (miss), by template.", []string{"template", "result"}, nil),
	}
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.sandboxes
	ch <- c.poolReady
	ch <- c.poolTarget
	ch <- c.claims
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.src.StateCounts() {
		ch <- prometheus.MustNewConstMetric(c.sandboxes, prometheus.GaugeValue, float64(s.Count), string(s.State), s.Isolation)
	}
	for _, p := range c.src.Pools() {
		ch <- prometheus.MustNewConstMetric(c.poolReady, prometheus.GaugeValue, float64(p.Ready), p.Template)
		ch <- prometheus.MustNewConstMetric(c.poolTarget, prometheus.GaugeValue, float64(p.Target), p.Template)
		ch <- prometheus.MustNewConstMetric(c.claims, prometheus.CounterValue, float64(p.Hits), p.Template, "hit")
		ch <- prometheus.MustNewConstMetric(c.claims, prometheus.CounterValue, float64(p.Misses), p.Template, "miss")
	}
}
