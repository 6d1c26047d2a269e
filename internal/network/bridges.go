package network

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// A Linux bridge takes at most 1,024 ports (BR_MAX_PORTS; the next veth
// fails with EXFULL), and every sandbox is one port. A server therefore
// spreads its sandboxes over several bridges: Config.Bridge (index 0) and
// overflow bridges made when the ones before are full. Every bridge carries
// the same gateway address, so a sandbox's address, gateway, routes and
// nameserver do not depend on its bridge: the allocator stays one next-fit
// over the whole subnet, a paused sandbox may come back on another bridge,
// and a restore plugs its netns without knowing the bridge. Bridge 0 holds the subnet's
// connected route (as before there were overflow bridges, so an upgraded
// server's sandboxes keep working); an overflow bridge holds the gateway as
// a /32 and a /32 route to each of its sandboxes. Traffic between bridges is
// routed by the host, through the forward chain that rejects sandbox to
// sandbox; the nftables rules match every bridge by name (bridgesSet).

// bridgePorts is how many sandboxes a bridge serves, below the kernel's
// 1,024 so that a leftover port or one an operator adds does not make a
// create fail.
const bridgePorts = 1000

// bridgeCount is how many bridges the subnet can need: one port per usable
// address (not the network, gateway and broadcast ones).
func bridgeCount(subnet netip.Prefix, perBridge int) int {
	usable := (1 << (32 - subnet.Bits())) - 3
	return max(1, (usable+perBridge-1)/perBridge)
}

// bridgeName names bridge i: Config.Bridge for 0, then "<bridge>-<i>", or,
// when that passes the kernel's 15 bytes, a name derived from the bridge's
// (keyed by it, so two servers' overflow bridges never share a name).
func bridgeName(bridge string, i int) string {
	if i == 0 {
		return bridge
	}
	suffix := "-" + strconv.Itoa(i)
	if len(bridge)+len(suffix) <= unix.IFNAMSIZ-1 {
		return bridge + suffix
	}
	h := sha256.Sum256([]byte("bridge:" + bridge))
	return ("ab" + hex.EncodeToString(h[:]))[:unix.IFNAMSIZ-1-len(suffix)] + suffix
}

// bridgeNames lists the names of every bridge the subnet can need.
func (m *Manager) bridgeNames() []string {
	out := make([]string, bridgeCount(m.cfg.Subnet, m.perBridge))
	for i := range out {
		out[i] = bridgeName(m.cfg.Bridge, i)
	}
	return out
}

// pickBridge places the sandbox on the first bridge with a free port. It
// never goes past the bridges the nftables rules name (bridgeNames): only
// with more sandboxes than the subnet holds, which a smaller --subnet
// after a restart can leave. Callers hold m.mu.
func (m *Manager) pickBridge(id string) bool {
	i, n := 0, bridgeCount(m.cfg.Subnet, m.perBridge)
	for i < n && m.ports[i] >= m.perBridge {
		i++
	}
	if i == n {
		return false
	}
	m.bridgeOf[id] = i
	m.ports[i]++
	return true
}

// dropBridge forgets sandbox id's port. Callers hold m.mu.
func (m *Manager) dropBridge(id string) {
	i, ok := m.bridgeOf[id]
	if !ok {
		return
	}
	delete(m.bridgeOf, id)
	if m.ports[i]--; m.ports[i] <= 0 {
		delete(m.ports, i)
	}
}

// relearnBridges places the sandboxes an earlier process attached: on the
// bridge their host port is on, or, for those without one (paused), on the
// first with room; their veth is made on it when they come back.
func (m *Manager) relearnBridges() {
	index := map[string]int{}
	for i, n := range m.bridgeNames() {
		index[n] = i
	}
	masters := map[int]int{} // bridge ifindex → bridge index
	var portless []string
	for id := range m.endpoints {
		l, err := netlink.LinkByName(m.hostVeth(id))
		if err != nil || l.Attrs().MasterIndex == 0 {
			portless = append(portless, id)
			continue
		}
		i, ok := masters[l.Attrs().MasterIndex]
		if !ok {
			i = -1
			if br, err := netlink.LinkByIndex(l.Attrs().MasterIndex); err == nil {
				if j, known := index[br.Attrs().Name]; known {
					i = j
				}
			}
			masters[l.Attrs().MasterIndex] = i
		}
		if i < 0 {
			portless = append(portless, id)
			continue
		}
		m.bridgeOf[id] = i
		m.ports[i]++
	}
	for _, id := range portless {
		if !m.pickBridge(id) {
			m.log.Warn("no bridge has room for a sandbox the subnet no longer holds; its network fails to come back", "id", id, "subnet", m.cfg.Subnet)
			m.bridgeOf[id] = 0
			m.ports[0]++
		}
	}
}

// bridgeOfID returns the index and name of sandbox id's bridge.
func (m *Manager) bridgeOfID(id string) (int, string) {
	m.mu.Lock()
	i := m.bridgeOf[id]
	m.mu.Unlock()
	return i, bridgeName(m.cfg.Bridge, i)
}

// bridgeFor returns sandbox id's bridge, made first if it is an overflow
// bridge that does not exist yet, with the host's /32 route to the
// sandbox's address on it. An overflow bridge is removed when its last
// sandbox detaches (pruneBridge); brMu keeps the two apart.
func (m *Manager) bridgeFor(id string) (netlink.Link, error) {
	i, name := m.bridgeOfID(id)
	if i == 0 {
		br, err := netlink.LinkByName(name)
		if err != nil {
			return nil, fmt.Errorf("bridge %s (is Setup done?): %w", name, err)
		}
		return br, nil
	}
	m.brMu.RLock()
	defer m.brMu.RUnlock()
	br, err := m.overflowBridge(name)
	if err != nil {
		return nil, err
	}
	ep, ok := m.Lookup(id)
	if !ok {
		return nil, fmt.Errorf("sandbox %s is not attached", id)
	}
	if err := netlink.RouteReplace(sandboxRoute(br, ep.IP, m.gateway)); err != nil {
		return nil, fmt.Errorf("route to %s on bridge %s: %w", ep.IP, name, err)
	}
	return br, nil
}

func sandboxRoute(br netlink.Link, ip, gateway netip.Addr) *netlink.Route {
	return &netlink.Route{LinkIndex: br.Attrs().Index, Scope: netlink.SCOPE_LINK, Src: gateway.AsSlice(),
		Dst: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(32, 32)}}
}

// bridgeMAC is the MAC the server gives a bridge it makes. A bridge made
// without one takes its lowest port's, which changes as sandboxes come and
// go, under the gateway entry every sandbox was seeded with
// (seedNeighbours): its frames to the old MAC go nowhere until the entry is
// probed again, seconds later. Setting the MAC of a bridge that exists
// leaves it without an operational state the link activation waits for,
// so a bridge an earlier version made keeps its ways until it is made anew.
func bridgeMAC(name string) net.HardwareAddr {
	h := sha256.Sum256([]byte("bridge-mac:" + name))
	h[0] = h[0]&0xfe | 0x02 // unicast, locally administered
	return net.HardwareAddr(h[:6])
}

// overflowBridge makes (if missing) and configures the overflow bridge
// name: its MAC (bridgeMAC), the gateway as a /32, no redirects, up.
func (m *Manager) overflowBridge(name string) (netlink.Link, error) {
	br, err := netlink.LinkByName(name)
	if err != nil {
		if !errors.As(err, new(netlink.LinkNotFoundError)) {
			return nil, fmt.Errorf("bridge %s: %w", name, err)
		}
		la := netlink.LinkAttrs{Name: name, HardwareAddr: bridgeMAC(name)}
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: la}); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("create bridge %s: %w", name, err)
		}
		if br, err = netlink.LinkByName(name); err != nil {
			return nil, fmt.Errorf("bridge %s: %w", name, err)
		}
	}
	gw := &netlink.Addr{IPNet: &net.IPNet{IP: m.gateway.AsSlice(), Mask: net.CIDRMask(32, 32)}}
	if err := netlink.AddrReplace(br, gw); err != nil {
		return nil, fmt.Errorf("bridge %s address: %w", name, err)
	}
	if err := os.WriteFile("/proc/sys/net/ipv4/conf/"+name+"/send_redirects", []byte("0"), 0o644); err != nil {
		return nil, fmt.Errorf("bridge %s: %w", name, err)
	}
	if br.Attrs().Flags&net.FlagUp == 0 {
		if err := netlink.LinkSetUp(br); err != nil {
			return nil, fmt.Errorf("bridge %s up: %w", name, err)
		}
	}
	return br, nil
}

// unrouteSandbox removes the host's route to a detached sandbox on an
// overflow bridge.
func (m *Manager) unrouteSandbox(i int, ip netip.Addr) error {
	if i == 0 {
		return nil
	}
	name := bridgeName(m.cfg.Bridge, i)
	br, err := netlink.LinkByName(name)
	if err != nil {
		return nil // gone with its routes
	}
	if err := netlink.RouteDel(sandboxRoute(br, ip, m.gateway)); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("route to %s on bridge %s: %w", ip, name, err)
	}
	return nil
}

// pruneBridge removes overflow bridge i once no sandbox is placed on it.
func (m *Manager) pruneBridge(i int) error {
	if i == 0 {
		return nil
	}
	m.brMu.Lock()
	defer m.brMu.Unlock()
	m.mu.Lock()
	n := m.ports[i]
	m.mu.Unlock()
	if n > 0 {
		return nil
	}
	return deleteLink(bridgeName(m.cfg.Bridge, i))
}

// setupBridges makes the overflow bridges relearnt sandboxes are on and
// removes empty ones an earlier process left.
func (m *Manager) setupBridges() error {
	names := m.bridgeNames()
	m.mu.Lock()
	used := map[int]bool{}
	for i := range m.ports {
		used[i] = true
	}
	m.mu.Unlock()
	index := map[string]int{}
	for i, n := range names[1:] {
		index[n] = i + 1
	}
	// A listing the kernel cut short (links changing meanwhile) only
	// leaves an empty bridge for the next start.
	links, err := netlink.LinkList()
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return fmt.Errorf("list links: %w", err)
	}
	for _, l := range links {
		if i, ok := index[l.Attrs().Name]; ok && !used[i] && l.Type() == "bridge" {
			if err := deleteLink(l.Attrs().Name); err != nil {
				return err
			}
		}
	}
	m.brMu.Lock()
	defer m.brMu.Unlock()
	for i := range used {
		if i == 0 {
			continue
		}
		if _, err := m.overflowBridge(bridgeName(m.cfg.Bridge, i)); err != nil {
			return err
		}
	}
	// The routes went away if a bridge did.
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, i := range m.bridgeOf {
		if i == 0 {
			continue
		}
		name := bridgeName(m.cfg.Bridge, i)
		br, err := netlink.LinkByName(name)
		if err != nil {
			return fmt.Errorf("bridge %s: %w", name, err)
		}
		if err := netlink.RouteReplace(sandboxRoute(br, m.endpoints[id].IP, m.gateway)); err != nil {
			return fmt.Errorf("route to %s on bridge %s: %w", m.endpoints[id].IP, name, err)
		}
	}
	return nil
}
