// Package destpolicy owns the rule of which network destinations the server
// may reach for a tenant. Classify names the address ranges that are never a
// tenant's destination (loopback, link-local and cloud metadata, private,
// shared, multicast...); the egress proxy applies it to sandbox traffic, and
// Policy applies it, with the host's own addresses, the sandbox subnet and
// the operator's allowlist, to every fetch the server makes on a tenant's
// behalf (registry pulls of template builds, later webhooks). Policy checks
// the address it is about to connect to, at connect time, so a name that
// resolves differently on each lookup or a redirect to a closed address is
// refused like a literal one.
package destpolicy

import "net/netip"

// Class is the kind of a destination address.
type Class uint8

// Classes of addresses. Every class but Public is closed to tenants.
const (
	Public      Class = iota
	Loopback          // 127/8, ::1
	Unspecified       // 0/8 ("this network"), ::, IPv4-compatible ::/96
	LinkLocal         // 169.254/16, fe80::/10: cloud metadata lives here
	Private           // RFC 1918, fc00::/7 (ULA, fd00:ec2::254 among them), fec0::/10
	Shared            // 100.64/10, carrier-grade NAT, often cloud-internal
	Multicast         // 224/4, ff00::/8
	Broadcast         // 255.255.255.255
	Reserved          // 240/4
)

// String says what an address of the class is, for messages.
func (c Class) String() string {
	switch c {
	case Loopback:
		return "a loopback address"
	case Unspecified:
		return "an unspecified address"
	case LinkLocal:
		return "a link-local address (cloud metadata services live there)"
	case Private:
		return "a private network address"
	case Shared:
		return "a carrier-grade NAT (shared) address"
	case Multicast:
		return "a multicast address"
	case Broadcast:
		return "the broadcast address"
	case Reserved:
		return "a reserved address"
	}
	return "a public address"
}

var (
	sharedV4   = netip.MustParsePrefix("100.64.0.0/10")
	thisNetV4  = netip.MustParsePrefix("0.0.0.0/8")
	reservedV4 = netip.MustParsePrefix("240.0.0.0/4")
	broadcast  = netip.AddrFrom4([4]byte{255, 255, 255, 255})
	compatV6   = netip.MustParsePrefix("::/96")        // IPv4-compatible (deprecated)
	nat64V6    = netip.MustParsePrefix("64:ff9b::/96") // NAT64: reaches the IPv4 inside
	sixToFour  = netip.MustParsePrefix("2002::/16")    // 6to4: the IPv4 in bits 16-48
	siteLocal  = netip.MustParsePrefix("fec0::/10")    // deprecated, still routed privately
)

// Classify says which class a is. IPv4-mapped (::ffff:a.b.c.d) and
// IPv4-embedding IPv6 forms (NAT64, 6to4) are classified by the IPv4
// address they reach.
func Classify(a netip.Addr) Class {
	a = a.Unmap().WithZone("")
	if a.Is6() {
		switch {
		case a.IsLoopback():
			return Loopback
		case a.IsUnspecified(), compatV6.Contains(a):
			return Unspecified
		case a.IsLinkLocalUnicast():
			return LinkLocal
		case a.IsMulticast():
			return Multicast
		case a.IsPrivate(), siteLocal.Contains(a):
			return Private
		case nat64V6.Contains(a):
			b := a.As16()
			return Classify(netip.AddrFrom4([4]byte(b[12:16])))
		case sixToFour.Contains(a):
			b := a.As16()
			return Classify(netip.AddrFrom4([4]byte(b[2:6])))
		}
		return Public
	}
	switch {
	case a.IsLoopback():
		return Loopback
	case thisNetV4.Contains(a):
		return Unspecified
	case a.IsLinkLocalUnicast():
		return LinkLocal
	case a.IsPrivate():
		return Private
	case sharedV4.Contains(a):
		return Shared
	case a.IsMulticast():
		return Multicast
	case a == broadcast:
		return Broadcast
	case reservedV4.Contains(a):
		return Reserved
	}
	return Public
}
