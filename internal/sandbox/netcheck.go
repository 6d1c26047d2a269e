package sandbox

import (
	"context"
	"fmt"
	"strings"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// CheckNetworkSpec validates a network configuration as CheckNetwork does,
// for a server with no secret store (the cluster's API tier): a header
// value naming a secret is refused, everything else gets the same answer.
func CheckNetworkSpec(ctx context.Context, allowInternet bool, n *NetworkSpec) error {
	if n != nil {
		for d, rules := range n.Rules {
			for i, r := range rules {
				if r.Transform == nil {
					continue
				}
				for k, v := range r.Transform.Headers {
					if strings.Contains(v, "${secrets.") {
						return fmt.Errorf("network.rules[%q][%d].transform.headers[%q]: secrets are not served here: %w", d, i, k, errdefs.ErrInvalidArgument)
					}
				}
			}
		}
	}
	// Without secret references the policy reads no state: a policies
	// value with no secret store answers like the manager's.
	var ps policies
	_, err := ps.policy(ctx, "", "", allowInternet, n)
	return err
}
