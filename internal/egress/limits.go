package egress

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentbox/agentbox/internal/audit"
)

// Limits bound what one sandbox can make the egress proxy and resolver
// hold or write, so a connection or DNS flood from it exhausts neither the
// server's descriptors and memory nor the audit log's disk. Zero values
// take the defaults.
type Limits struct {
	// Conns caps a sandbox's concurrent connections through the proxy
	// (DNS over TCP included); past it new ones are reset. Default 512.
	Conns int
	// DNSRate is the queries per second a sandbox's resolver answers
	// (burst: twice as many); past it queries get REFUSED. Default 100.
	DNSRate float64
	// DNSInFlight caps a sandbox's queries waiting on an upstream
	// nameserver. Default 32.
	DNSInFlight int
	// AuditRate is the egress and DNS audit records per second kept per
	// sandbox (burst: ten times as many). Past it records are counted per
	// destination and decision, and written as "suppressed" rows with the
	// count every few seconds (auditagg.go). Default 20.
	AuditRate float64
	// AuditBurst is how many records a sandbox may add at once before
	// AuditRate applies. Default ten times AuditRate.
	AuditBurst int
}

func (l *Limits) setDefaults() {
	if l.Conns <= 0 {
		l.Conns = 512
	}
	if l.DNSRate <= 0 {
		l.DNSRate = 100
	}
	if l.DNSInFlight <= 0 {
		l.DNSInFlight = 32
	}
	if l.AuditRate <= 0 {
		l.AuditRate = 20
	}
	if l.AuditBurst <= 0 {
		l.AuditBurst = int(min(10*l.AuditRate, math.MaxInt32))
	}
}

// bucket is a token bucket.
type bucket struct {
	mu     sync.Mutex
	rate   float64
	burst  float64
	tokens float64
	last   time.Time
}

func newBucket(rate, burst float64) *bucket {
	return &bucket{rate: rate, burst: burst, tokens: burst, last: time.Now()}
}

func (b *bucket) allow() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// quota is one sandbox's share of the limits. It outlives policy changes
// (a new binding keeps its predecessor's quota).
type quota struct {
	conns   atomic.Int64
	dnsBusy atomic.Int64
	dns     *bucket
	audit   *aggregator // the audit rate, and what it held back (auditagg.go)
}

func newQuota(l Limits) *quota {
	return &quota{dns: newBucket(l.DNSRate, 2*l.DNSRate), audit: newAggregator(l.AuditRate, float64(l.AuditBurst))}
}

// acquire takes one of n slots; release gives it back.
func acquire(c *atomic.Int64, n int) bool {
	if c.Add(1) > int64(n) {
		c.Add(-1)
		return false
	}
	return true
}

// admit applies the sandbox's audit rate to ev: it reports whether ev
// may be written as it is; otherwise ev is counted in its destination's
// row, written at the end of the window.
func (s *Server) admit(q *quota, ev audit.Event) bool {
	return q.audit.admit(ev)
}

// flushSuppressed queues the rows of what q held back since the last
// window, labelled like like.
func (s *Server) flushSuppressed(q *quota, like audit.Event) {
	s.pushRows(q.audit.drain(like, s.cfg.Limits.AuditRate, s.nflogDropped.Load()))
}

// flushAll writes the held-back rows of every bound sandbox (at most
// aggTopRows+4*aggLevelRows and a family row per family each) every
// window; a flood that stopped still gets its counts recorded.
func (s *Server) flushAll() {
	dropped := s.nflogDropped.Swap(false)
	s.mu.RLock()
	bs := make([]*binding, 0, len(s.byID))
	for _, b := range s.byID {
		bs = append(bs, b)
	}
	s.mu.RUnlock()
	for _, b := range bs {
		s.pushRows(b.q.audit.drain(audit.Event{SandboxID: b.id, TeamID: b.policy.TeamID, APIKeyID: b.policy.APIKeyID},
			s.cfg.Limits.AuditRate, dropped))
	}
}

// pushRows queues a window's rows, waiting for room in the queue: they
// are the only record of what was not written one by one, and are bounded
// per sandbox and window, so waiting cannot grow without bound.
func (s *Server) pushRows(rows []audit.Event) {
	for _, ev := range rows {
		select {
		case s.auditQ <- ev:
		case <-s.stop:
			return
		}
	}
}
