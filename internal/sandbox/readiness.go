package sandbox

import (
	"context"
	"errors"

	"github.com/agentbox/agentbox/internal/runtime"
)

// Readiness is what a load balancer or a Kubernetes readiness probe asks:
// can this server create sandboxes now? Each check is "ok" or its reason.
type Readiness struct {
	Ready   bool              `json:"ready"`
	Store   string            `json:"store"`
	Network string            `json:"network"`
	Tiers   map[string]string `json:"isolation"` // every tier; a missing optional one does not make the server unready
}

// Readiness runs the checks. The server is ready when its store answers,
// its network is up and the default tier (container) can run; the other
// tiers are reported but optional.
func (m *Manager) Readiness(ctx context.Context) Readiness {
	r := Readiness{Store: checkResult(m.store.Ping(ctx)), Network: "ok", Tiers: map[string]string{}}
	if nr, ok := m.net.(interface{ Ready(context.Context) error }); ok {
		r.Network = checkResult(nr.Ready(ctx))
	}
	tc, _ := m.rt.(runtime.TierChecker)
	def := runtime.DefaultIsolation()
	for _, ti := range runtime.TierInfos() {
		switch {
		case tc != nil:
			r.Tiers[ti.Isolation] = checkResult(tc.TierAvailable(ti.Runtime))
		case ti.Isolation == def:
			r.Tiers[ti.Isolation] = "ok"
		default:
			r.Tiers[ti.Isolation] = "not run by this server's runtime"
		}
	}
	r.Ready = r.Store == "ok" && r.Network == "ok" && r.Tiers[def] == "ok"
	return r
}

func checkResult(err error) string {
	if err == nil {
		return "ok"
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "timed out"
	}
	return err.Error()
}
