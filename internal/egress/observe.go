package egress

import "strings"

// Decision is one finished connection or proxied request of a sandbox.
type Decision struct {
	TeamID, SandboxID string
	Allowed           bool
	// Reason is a small fixed class of the rule that decided (allow_out,
	// deny_out, default, limit, error, other): never the rule's text,
	// which holds tenant-chosen names.
	Reason         string
	Sent, Received int64 // bytes sandbox → destination and back
}

// Observer receives every decision (metrics and usage metering). Calls are
// synchronous on the connection's goroutine and must be cheap.
type Observer interface {
	EgressDone(d Decision)
}

// SetObserver sends every decision to o. Call before sandboxes are bound.
func (s *Server) SetObserver(o Observer) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.obs = o
}

func (s *Server) observe(e *connEvent) {
	s.mu.RLock()
	o := s.obs
	s.mu.RUnlock()
	if o == nil {
		return
	}
	o.EgressDone(Decision{TeamID: e.b.policy.TeamID, SandboxID: e.b.id, Allowed: e.allow, Reason: reasonClass(e),
		Sent: e.sent, Received: e.received})
}

func reasonClass(e *connEvent) string {
	switch {
	case e.err != "":
		return "error"
	case strings.HasPrefix(e.rule, "allowOut "):
		return "allow_out"
	case strings.HasPrefix(e.rule, "denyOut "):
		return "deny_out"
	case strings.HasPrefix(e.rule, "default:"):
		return "default"
	case strings.HasPrefix(e.rule, "limit:"):
		return "limit"
	}
	return "other"
}
