// Package network gives every sandbox its own network namespace, a veth pair to
// the host bridge, an IP address, and nftables rules that keep it away from the
// host, from other sandboxes and from metadata endpoints.
package network

import (
	"net/netip"
)

// Policy is a sandbox's egress policy.
type Policy struct {
	// AllowInternet permits outbound traffic to public addresses. The host,
	// other sandboxes, private (RFC 1918, CGNAT) and link-local ranges stay
	// denied regardless; only the nameservers from Manager.DNS are reachable
	// on port 53. Without it a sandbox reaches nothing but connections the
	// host opens to it.
	AllowInternet bool
}

// Endpoint is what a sandbox gets from Attach.
type Endpoint struct {
	IP        netip.Addr // the sandbox's address on the bridge
	Gateway   netip.Addr // the bridge address (default route)
	NetNSPath string     // bind-mounted network namespace file
}
