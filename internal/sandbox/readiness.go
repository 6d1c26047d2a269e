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
// its network is up and the default tier (container) can run; the gVisor
// tier is reported but optional.
func (m *Manager) Readiness(ctx context.Context) Readiness {
	r := Readiness{Store: checkResult(m.store.Ping(ctx)), Network: "ok", Tiers: map[string]string{}}
	if nr, ok := m.net.(interface{ Ready(context.Context) error }); ok {
		r.Network = checkResult(nr.Ready(ctx))
	}
	tc, _ := m.rt.(runtime.TierChecker)
	for _, iso := range Isolations() {
		switch {
		case tc != nil:
			r.Tiers[iso] = checkResult(tc.TierAvailable(RuntimeTier(iso)))
		case iso == IsolationContainer:
			r.Tiers[iso] = "ok"
		default:
			r.Tiers[iso] = "not run by this server's runtime"
		}
	}
	r.Ready = r.Store == "ok" && r.Network == "ok" && r.Tiers[IsolationContainer] == "ok"
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
