// Package network gives every sandbox its own network namespace, a veth pair to
// the host bridge, an IP address, and nftables rules that keep it away from the
// host, from other sandboxes and from metadata endpoints.
package network

import (
	"net/netip"
)

// Endpoint is what a sandbox gets from Attach.
type Endpoint struct {
	IP        netip.Addr // the sandbox's address on the bridge
	Gateway   netip.Addr // the bridge address (default route)
	NetNSPath string     // bind-mounted network namespace file
	// Deferred: the runtime makes the netns (inside the sandbox's user
	// namespace) and hands it over with Manager.Plug; until then
	// NetNSPath is a placeholder file.
	Deferred bool
}
