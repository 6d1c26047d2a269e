package main

import (
	"context"

	"github.com/agentbox/agentbox/internal/network"
	"github.com/agentbox/agentbox/internal/template"
)

// buildNetwork attaches the RUN steps of API template builds to a network
// namespace of their own, with the same isolation as a sandbox that may use
// the internet (package installs): never the host, its neighbours or private
// ranges.
func buildNetwork(nw *network.Manager) template.NetworkFunc {
	return func(ctx context.Context, id string) (string, []string, func(), error) {
		ep, err := nw.Attach(ctx, id, network.Policy{AllowInternet: true})
		if err != nil {
			return "", nil, nil, err
		}
		release := func() { _ = nw.Detach(context.Background(), id) }
		if ep.Deferred {
			// Build steps run in the host's user namespace: a plain netns.
			if err := nw.Plug(ctx, id, 0); err != nil {
				release()
				return "", nil, nil, err
			}
		}
		return ep.NetNSPath, nw.DNS(), release, nil
	}
}
