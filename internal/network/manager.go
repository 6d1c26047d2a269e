package network

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"regexp"
	"sort"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/hostkey"
	"github.com/agentbox/agentbox/internal/rollback"
)

// Config configures the Manager. Zero values take the defaults.
type Config struct {
	// Bridge is the host bridge sandboxes attach to. Default "agentbox0".
	// Past its first 1,000 sandboxes the server adds overflow bridges
	// named after it (bridges.go).
	Bridge string
	// Subnet holds the gateway (its first address) and every sandbox
	// address. IPv4 only. Default 10.11.0.0/16.
	Subnet netip.Prefix
	// NetNSDir holds one bind-mounted netns file per sandbox, named by an
	// opaque key of its id (hostnames.go); NetNSDir+".addr" holds their
	// address records. Default /run/agentbox/netns.
	NetNSDir string
	// Table is the nftables table (family inet) the Manager owns and
	// rewrites. Default "agentbox".
	Table string
	// ResolvConf is read for the host's nameservers. Default /etc/resolv.conf.
	ResolvConf string
	// OperatorAllow opens private ranges (say, a package mirror on the LAN)
	// to sandboxes whose policy allows them. Link-local stays closed.
	OperatorAllow []netip.Prefix
	// Deferred leaves making each sandbox's netns to its runtime, which
	// hands it over with Plug (see plug.go): a sandbox in a user namespace
	// needs a netns owned by that namespace.
	Deferred bool
}

func (c *Config) setDefaults() error {
	if c.Bridge == "" {
		c.Bridge = "agentbox0"
	}
	if !c.Subnet.IsValid() {
		c.Subnet = netip.MustParsePrefix("10.11.0.0/16")
	}
	if c.NetNSDir == "" {
		c.NetNSDir = "/run/agentbox/netns"
	}
	if c.Table == "" {
		c.Table = "agentbox"
	}
	if c.ResolvConf == "" {
		c.ResolvConf = "/etc/resolv.conf"
	}
	switch {
	case len(c.Bridge) > 15:
		return fmt.Errorf("bridge name %q longer than 15 bytes: %w", c.Bridge, errdefs.ErrInvalidArgument)
	case !c.Subnet.Addr().Is4() || c.Subnet.Bits() > 30:
		return fmt.Errorf("subnet %s must be IPv4 and at most /30: %w", c.Subnet, errdefs.ErrInvalidArgument)
	}
	c.Subnet = c.Subnet.Masked()
	return nil
}

// Manager owns the bridge, the nftables table and every sandbox's netns.
// It is safe for concurrent use.
type Manager struct {
	cfg     Config
	log     *slog.Logger
	gateway netip.Addr
	dns     []string

	mu        sync.Mutex
	used      map[netip.Addr]string // allocated address → sandbox id
	last      netip.Addr            // most recently allocated address (next-fit)
	endpoints map[string]Endpoint   // by sandbox id
	denied    map[string]bool       // ids in the no_internet set
	byName    map[string]bool       // ids in the by_name set
	ipChains  map[string]bool       // ids with their own allowOut/denyOut chain
	bridgeOf  map[string]int        // sandbox id → index of its bridge (bridges.go)
	ports     map[int]int           // bridge index → sandboxes placed on it
	perBridge int                   // bridgePorts; tests lower it

	// brMu: read-held while an overflow bridge is made or used, held
	// while an empty one is removed.
	brMu sync.RWMutex

	egress      Egress
	egressPorts EgressPorts

	keys hostkey.Keyer // names sandboxes on the host (hostnames.go)
	// legacyVeth: sandboxes whose port an earlier version named (found at
	// New; read-only after it).
	legacyVeth map[string]bool
}

// Egress is the host-side egress proxy and resolver: it learns every
// sandbox's address and policy.
type Egress interface {
	Bind(id string, ip netip.Addr, p Policy) error
	Unbind(id string)
}

// EgressPorts are the ports the egress proxy (TCP) and DNS resolver (UDP
// and TCP) listen on at the gateway address, and the NFLOG group it reads
// the packets nftables refused or let out without it from (0: none).
type EgressPorts struct {
	Proxy    uint16
	DNS      uint16
	LogGroup uint16
}

// SetEgress routes every sandbox's TCP and DNS through e, listening on
// ports at Gateway(). Call it before Setup; sandboxes then get the gateway as
// their nameserver.
func (m *Manager) SetEgress(e Egress, ports EgressPorts) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.egress, m.egressPorts = e, ports
}

// validID keeps ids usable as file names and interface-name seeds.
var validID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// New creates a Manager and re-learns the sandboxes an earlier process
// attached (from the netns files under NetNSDir), so addresses are never
// handed out twice after a restart. Call Setup before Attach.
func New(cfg Config, log *slog.Logger) (*Manager, error) {
	return newManager(cfg, log, bridgePorts)
}

// newManager is New with perBridge sandboxes a bridge.
func newManager(cfg Config, log *slog.Logger, perBridge int) (*Manager, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	m := &Manager{
		cfg:       cfg,
		log:       log.With("component", "network"),
		gateway:   cfg.Subnet.Addr().Next(),
		used:      map[netip.Addr]string{},
		endpoints: map[string]Endpoint{},
		denied:    map[string]bool{},
		byName:    map[string]bool{},
		ipChains:  map[string]bool{},
		bridgeOf:  map[string]int{},
		ports:     map[int]int{},
		perBridge: perBridge,

		legacyVeth: map[string]bool{},
	}
	m.dns = m.hostDNS()
	keys, err := loadKeys(m.recordDir())
	if err != nil {
		return nil, err
	}
	m.keys = keys
	if err := m.relearn(); err != nil {
		return nil, err
	}
	return m, nil
}

// Gateway returns the bridge address, the sandboxes' default route.
func (m *Manager) Gateway() netip.Addr { return m.gateway }

// DNS returns the nameservers sandboxes should use: the egress resolver at
// the gateway when there is one, else the host's that a sandbox can reach
// (not loopback ones).
func (m *Manager) DNS() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.egressPorts.DNS != 0 {
		return []string{m.gateway.String()}
	}
	return append([]string(nil), m.dns...)
}

// HostDNS returns the host's own nameservers, loopback ones included: the
// upstreams of the egress resolver.
func HostDNS(resolvConf string) []string {
	if resolvConf == "" {
		resolvConf = "/etc/resolv.conf"
	}
	b, err := os.ReadFile(resolvConf)
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "nameserver" {
			if ip, err := netip.ParseAddr(f[1]); err == nil && ip.Is4() {
				out = append(out, ip.String())
			}
		}
	}
	return out
}

func (m *Manager) hostDNS() []string {
	b, err := os.ReadFile(m.cfg.ResolvConf)
	if err != nil {
		m.log.Warn("no host resolv.conf; sandboxes get no nameserver", "path", m.cfg.ResolvConf, "err", err)
		return nil
	}
	var out, skipped []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "nameserver" {
			continue
		}
		ip, err := netip.ParseAddr(f[1])
		if err != nil || ip.IsLoopback() {
			skipped = append(skipped, f[1])
			continue
		}
		out = append(out, ip.String())
	}
	if len(skipped) > 0 {
		m.log.Warn("host nameservers unreachable from sandboxes skipped", "skipped", skipped, "kept", out)
	}
	return out
}

// hostVeth names the host side of a sandbox's veth pair. Interface names are
// at most 15 bytes, so the id's key is cut rather than the id: truncation
// collides for ids with a common prefix. The name is keyed by this server's
// secret, not by the id alone: interface names and bridge-family nftables
// rules are host-wide, and two servers on one host (two node agents) may
// hold the same id at once (a suspended sandbox moved to another agent
// keeps its id), so an id-only name would put one server's port under the
// other's anti-spoofing rules (which drop everything not from that server's
// address) and let one server's Detach delete the other's port. A host user
// who knows an id cannot name its port either.
func (m *Manager) hostVeth(id string) string {
	if m.legacyVeth[id] {
		return legacyHostVeth(id)
	}
	return "ab" + m.keys.Key(id)[:12]
}

// legacyHostVeth is the name earlier versions gave the host end (a hash of
// the id alone); a sandbox whose port had it when this process started
// keeps it, and allowOut/denyOut chains (per server table) are named by it.
func legacyHostVeth(id string) string {
	h := sha256.Sum256([]byte(id))
	return "ab" + hex.EncodeToString(h[:])[:12]
}

// relearn reads the address of every sandbox an earlier process attached:
// from its record, or from eth0 for sandboxes attached before records
// existed.
func (m *Manager) relearn() error {
	pins, err := m.pinned()
	if err != nil {
		return err
	}
	denied, named := m.addrSet(noInternetSet), m.addrSet(byNameSet)
	for id := range pins {
		ip, err := m.readAddr(id)
		if err != nil {
			ip, err = readNSAddr(m.nsPath(id))
		}
		if err != nil {
			m.log.Warn("netns without a recorded address or a usable eth0; Detach will clean it", "id", id, "err", err)
			continue
		}
		m.used[ip] = id
		m.endpoints[id] = Endpoint{IP: ip, Gateway: m.gateway, NetNSPath: m.nsPath(id), Deferred: m.cfg.Deferred}
		if _, err := netlink.LinkByName(legacyHostVeth(id)); err == nil {
			m.legacyVeth[id] = true
		}
		if denied[ip] {
			m.denied[id] = true
		}
		if named[ip] {
			m.byName[id] = true
		}
	}
	m.relearnBridges()
	return nil
}

func readNSAddr(path string) (netip.Addr, error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return netip.Addr{}, err
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return netip.Addr{}, err
	}
	defer h.Close()
	link, err := h.LinkByName("eth0")
	if err != nil {
		return netip.Addr{}, err
	}
	addrs, err := h.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return netip.Addr{}, err
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok {
			return ip, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("eth0 has no IPv4 address")
}

// Setup prepares the host: bridge with the gateway address, IP forwarding,
// and a freshly written nftables table. Safe to call on every start.
func (m *Manager) Setup(ctx context.Context) error {
	if err := os.MkdirAll(m.cfg.NetNSDir, 0o755); err != nil {
		return fmt.Errorf("netns dir: %w", err)
	}
	br, err := netlink.LinkByName(m.cfg.Bridge)
	if err != nil {
		if !errors.As(err, new(netlink.LinkNotFoundError)) {
			return fmt.Errorf("bridge %s: %w", m.cfg.Bridge, err)
		}
		// With a MAC of its own (bridgeMAC): a bridge without one takes
		// its lowest port's, which changes as sandboxes come and go under
		// the gateway entry every sandbox was seeded with.
		la := netlink.LinkAttrs{Name: m.cfg.Bridge, HardwareAddr: bridgeMAC(m.cfg.Bridge)}
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: la}); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("create bridge %s: %w", m.cfg.Bridge, err)
		}
		if br, err = netlink.LinkByName(m.cfg.Bridge); err != nil {
			return fmt.Errorf("bridge %s: %w", m.cfg.Bridge, err)
		}
	}
	gw := &netlink.Addr{IPNet: &net.IPNet{IP: m.gateway.AsSlice(), Mask: net.CIDRMask(m.cfg.Subnet.Bits(), 32)}}
	if err := netlink.AddrReplace(br, gw); err != nil {
		return fmt.Errorf("bridge address: %w", err)
	}
	if err := netlink.LinkSetUp(br); err != nil {
		return fmt.Errorf("bridge up: %w", err)
	}
	for _, s := range []struct{ path, val string }{
		{"/proc/sys/net/ipv4/ip_forward", "1"},
		// The host must not tell a sandbox to talk to a neighbour directly.
		{"/proc/sys/net/ipv4/conf/" + m.cfg.Bridge + "/send_redirects", "0"},
	} {
		if err := os.WriteFile(s.path, []byte(s.val), 0o644); err != nil {
			return fmt.Errorf("sysctl %s: %w", s.path, err)
		}
	}
	if err := raiseNeighbourTable(m.cfg.Subnet); err != nil {
		return err
	}
	if err := m.setupBridges(); err != nil {
		return err
	}
	m.mu.Lock()
	var keep, keepByName []netip.Addr
	for id := range m.denied {
		if ep, ok := m.endpoints[id]; ok {
			keep = append(keep, ep.IP)
		}
	}
	for id := range m.byName {
		if ep, ok := m.endpoints[id]; ok {
			keepByName = append(keepByName, ep.IP)
		}
	}
	m.mu.Unlock()
	if err := m.installRules(keep, keepByName); err != nil {
		return err
	}
	m.log.Info("network ready", "bridge", m.cfg.Bridge, "gateway", m.gateway, "subnet", m.cfg.Subnet, "table", m.cfg.Table)
	return nil
}

// addrSet reads the current members of an address set; empty when there
// is none yet.
func (m *Manager) addrSet(name string) map[netip.Addr]bool {
	out := map[netip.Addr]bool{}
	ips, err := m.readSet(name)
	if err != nil {
		return out
	}
	for _, ip := range ips {
		out[ip] = true
	}
	return out
}

func (m *Manager) allocate(id string) (netip.Addr, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.endpoints[id]; ok {
		return netip.Addr{}, fmt.Errorf("sandbox %s already attached: %w", id, errdefs.ErrConflict)
	}
	// Next-fit, not lowest-free: a just-freed address is handed out again as
	// late as possible, so stale neighbour entries and idle keep-alive
	// connections to a dead sandbox never reach its successor.
	first := m.gateway.Next()
	usable := func(ip netip.Addr) bool { return m.cfg.Subnet.Contains(ip) && m.cfg.Subnet.Contains(ip.Next()) }
	start := m.last.Next()
	if !m.last.IsValid() || !usable(start) {
		start = first
	}
	full := func() error {
		return fmt.Errorf("subnet %s is full (%d sandboxes): give the server a larger --subnet (a /20 holds 4,093): %w",
			m.cfg.Subnet, len(m.used), errdefs.ErrResourceExhausted)
	}
	ip := start
	for {
		if _, taken := m.used[ip]; !taken {
			if !m.pickBridge(id) {
				return netip.Addr{}, full()
			}
			m.used[ip] = id
			m.last = ip
			m.endpoints[id] = Endpoint{IP: ip, Gateway: m.gateway, NetNSPath: m.nsPath(id), Deferred: m.cfg.Deferred}
			return ip, nil
		}
		if ip = ip.Next(); !usable(ip) {
			ip = first
		}
		if ip == start {
			return netip.Addr{}, full()
		}
	}
}

func (m *Manager) release(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if ep, ok := m.endpoints[id]; ok && m.used[ep.IP] == id {
		delete(m.used, ep.IP)
	}
	delete(m.endpoints, id)
	m.dropBridge(id)
	delete(m.denied, id)
	delete(m.byName, id)
}

// Attach gives sandbox id its own network namespace with an address on the
// bridge and applies p. On error nothing is left behind.
func (m *Manager) Attach(ctx context.Context, id string, p Policy) (ep Endpoint, err error) {
	if !validID.MatchString(id) {
		return Endpoint{}, fmt.Errorf("sandbox id %q: %w", id, errdefs.ErrInvalidArgument)
	}
	ip, err := m.allocate(id)
	if err != nil {
		return Endpoint{}, err
	}
	var undo rollback.List
	defer func() {
		if err != nil {
			_ = undo.Run(context.WithoutCancel(ctx))
		} else {
			undo.Release()
		}
	}()
	undo.Add("address", func(context.Context) error {
		i, _ := m.bridgeOfID(id)
		_ = m.unrouteSandbox(i, ip)
		m.release(id)
		_ = m.pruneBridge(i)
		return nil
	})
	m.forgetNeighbour(id, ip)

	path := m.nsPath(id)
	// Record the address before the netns exists: gVisor strips it from
	// eth0, so after a restart this record is the only place it is kept.
	if err := m.writeAddr(id, ip); err != nil {
		return Endpoint{}, err
	}
	undo.Add("address record", func(context.Context) error { return os.Remove(m.addrPath(id)) })
	if m.cfg.Deferred {
		// The netns file is a placeholder until Plug pins the namespace
		// on it; it marks the sandbox attached across restarts.
		if err := placeholder(path); err != nil {
			return Endpoint{}, fmt.Errorf("netns %s: %w", id, err)
		}
		undo.Add("netns placeholder", func(context.Context) error { return removeNetNS(path) })
		// Plug makes the veth pair, with the sandbox's end inside.
		undo.Add("veth pair", func(context.Context) error {
			return errors.Join(deleteLink(m.hostVeth(id)), deleteLink(m.peerVeth(id)))
		})
	} else {
		if err := newNetNS(path); err != nil {
			return Endpoint{}, fmt.Errorf("netns %s: %w", id, err)
		}
		undo.Add("netns", func(context.Context) error { return removeNetNS(path) })
		if err := m.attachNetNS(ctx, id, path, ip); err != nil {
			return Endpoint{}, err
		}
		undo.Add("veth", func(context.Context) error { return deleteLink(m.hostVeth(id)) })
	}
	if err := m.addSpoofRules(id, ip); err != nil {
		return Endpoint{}, err
	}
	undo.Add("spoof rules", func(context.Context) error { return m.removeSpoofRules(id, ip) })
	undo.Add("policy", func(context.Context) error {
		_ = m.setNoInternet(ip, false)
		_ = m.setMember(byNameSet, ip, false)
		_ = m.setIPRules(id, ip, Policy{})
		if e := m.egressOf(); e != nil {
			e.Unbind(id)
		}
		return nil
	})
	if err := m.applyPolicy(id, ip, p); err != nil {
		return Endpoint{}, err
	}

	ep = Endpoint{IP: ip, Gateway: m.gateway, NetNSPath: path, Deferred: m.cfg.Deferred}
	m.log.Debug("sandbox attached", "id", id, "ip", ip, "veth", m.hostVeth(id), "internet", p.AllowInternet)
	return ep, nil
}

func (m *Manager) egressOf() Egress {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.egress
}

func (m *Manager) applyPolicy(id string, ip netip.Addr, p Policy) error {
	e := m.egressOf()
	if e == nil && p.NeedsProxy() {
		return fmt.Errorf("domain rules, header rules and egress proxies need the server's egress proxy, which is off: %w", errdefs.ErrInvalidArgument)
	}
	// The proxy learns the policy first: it must never see a sandbox whose
	// packets the kernel already sends it without knowing what to allow.
	if e != nil {
		if err := e.Bind(id, ip, p); err != nil {
			return err
		}
	}
	if err := m.setIPRules(id, ip, p); err != nil {
		return err
	}
	// The sets change only where membership does: each change is an
	// nftables transaction, and a new sandbox (the create path) is in
	// neither set. A member is recorded before it is added, so a failure
	// in between leaves Detach something to remove, never a stale member.
	m.mu.Lock()
	wasDenied, wasNamed := m.denied[id], m.byName[id]
	if !p.AllowInternet {
		m.denied[id] = true
	}
	if p.DecidesByName() {
		m.byName[id] = true
	}
	m.mu.Unlock()
	if wasDenied || !p.AllowInternet {
		if err := m.setNoInternet(ip, !p.AllowInternet); err != nil {
			return err
		}
	}
	if wasNamed || p.DecidesByName() {
		if err := m.setMember(byNameSet, ip, p.DecidesByName()); err != nil {
			return err
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if p.AllowInternet {
		delete(m.denied, id)
	} else {
		m.denied[id] = true
	}
	if p.DecidesByName() {
		m.byName[id] = true
	} else {
		delete(m.byName, id)
	}
	return nil
}

// SetPolicy changes an attached sandbox's egress policy.
func (m *Manager) SetPolicy(ctx context.Context, id string, p Policy) error {
	ep, ok := m.Lookup(id)
	if !ok {
		return fmt.Errorf("sandbox %s network: %w", id, errdefs.ErrNotFound)
	}
	return m.applyPolicy(id, ep.IP, p)
}

// Detach removes the sandbox's veth, netns and rules and frees its address.
// Detaching an unknown id is not an error.
func (m *Manager) Detach(ctx context.Context, id string) error {
	if !validID.MatchString(id) {
		return fmt.Errorf("sandbox id %q: %w", id, errdefs.ErrInvalidArgument)
	}
	var errs []error
	ep, ok := m.Lookup(id)
	m.mu.Lock()
	denied, named := m.denied[id], m.byName[id]
	m.mu.Unlock()
	if ok {
		// Only the sets it is in (applyPolicy records a member first).
		if denied {
			if err := m.setNoInternet(ep.IP, false); err != nil {
				errs = append(errs, err)
			}
		}
		if named {
			if err := m.setMember(byNameSet, ep.IP, false); err != nil {
				errs = append(errs, err)
			}
		}
		if err := m.setIPRules(id, ep.IP, Policy{}); err != nil {
			errs = append(errs, err)
		}
	}
	if e := m.egressOf(); e != nil {
		e.Unbind(id)
	}
	if ok {
		if err := m.removeSpoofRules(id, ep.IP); err != nil {
			errs = append(errs, err)
		}
	}
	for _, name := range []string{m.hostVeth(id), m.peerVeth(id)} {
		if err := deleteLink(name); err != nil {
			errs = append(errs, err)
		}
	}
	if err := removeNetNS(m.nsPath(id)); err != nil {
		errs = append(errs, err)
	}
	if err := os.Remove(m.addrPath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	bridge, _ := m.bridgeOfID(id)
	if ok {
		if err := m.unrouteSandbox(bridge, ep.IP); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("detach %s: %w", id, err)
	}
	m.release(id)
	if err := m.pruneBridge(bridge); err != nil {
		return fmt.Errorf("detach %s: %w", id, err)
	}
	return nil
}

// List returns the ids that have a netns file, attached by this process or
// an earlier one.
func (m *Manager) List(ctx context.Context) ([]string, error) {
	pins, err := m.pinned()
	if err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(pins))
	for id := range pins {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids, nil
}

// Lookup returns the endpoint of an attached sandbox.
func (m *Manager) Lookup(id string) (Endpoint, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ep, ok := m.endpoints[id]
	return ep, ok
}

func deleteLink(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		if errors.As(err, new(netlink.LinkNotFoundError)) {
			return nil
		}
		return fmt.Errorf("veth %s: %w", name, err)
	}
	if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("delete veth %s: %w", name, err)
	}
	return nil
}

// newNetNS creates a network namespace (in the host's user namespace) and
// pins it by bind-mounting it onto a new file at path.
func newNetNS(path string) error {
	if err := placeholder(path); err != nil {
		return err
	}
	if err := pinHostNetNS(path); err != nil {
		os.Remove(path)
		return err
	}
	return nil
}

// pinHostNetNS creates a network namespace in the host's user namespace,
// with the sandbox sysctls, and pins it on the existing file at path.
func pinHostNetNS(path string) error {
	err := onThread(func() error {
		ns, err := netns.New()
		if err != nil {
			return fmt.Errorf("unshare: %w", err)
		}
		ns.Close()
		return nil
	}, func() error {
		src := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		if err := unix.Mount(src, path, "none", unix.MS_BIND, ""); err != nil {
			return err
		}
		return netnsSysctls()
	})
	if err != nil {
		_ = unix.Unmount(path, unix.MNT_DETACH)
	}
	return err
}

// netnsSysctls runs on a thread inside the new netns: /proc/sys/net follows
// the opening thread's namespace.
func netnsSysctls() error {
	for _, s := range []struct {
		path, val string
		optional  bool
	}{
		// Go listens with MPTCP by default; CRIU cannot dump it and
		// Landlock's TCP rules do not cover it.
		{"/proc/sys/net/mptcp/enabled", "0", true},
		// No IPv6 at all: nothing leaks around the IPv4 rules.
		{"/proc/sys/net/ipv6/conf/all/disable_ipv6", "1", false},
		{"/proc/sys/net/ipv6/conf/default/disable_ipv6", "1", false},
		// The host's ICMP redirects would point a sandbox straight at a
		// neighbour behind the isolated bridge port: ignore them. "default"
		// is what eth0 inherits when it arrives later.
		{"/proc/sys/net/ipv4/conf/all/accept_redirects", "0", false},
		{"/proc/sys/net/ipv4/conf/default/accept_redirects", "0", false},
	} {
		if err := os.WriteFile(s.path, []byte(s.val), 0o644); err != nil {
			if s.optional && errors.Is(err, os.ErrNotExist) {
				continue
			}
			return fmt.Errorf("sysctl %s: %w", s.path, err)
		}
	}
	return nil
}

func removeNetNS(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	return nil
}

// EgressCA returns the PEM certificate of the CA the egress proxy uses for
// sandbox id's header rules.
func (m *Manager) EgressCA(id string) ([]byte, error) {
	ca, ok := m.egressOf().(interface{ CACertPEM(string) ([]byte, error) })
	if !ok {
		return nil, fmt.Errorf("no egress proxy: %w", errdefs.ErrUnavailable)
	}
	return ca.CACertPEM(id)
}

// Ready reports whether sandboxes can be attached: the bridge exists and
// is up (an operator or another program may have deleted it).
func (m *Manager) Ready(context.Context) error {
	br, err := netlink.LinkByName(m.cfg.Bridge)
	if err != nil {
		return fmt.Errorf("bridge %s: %w", m.cfg.Bridge, err)
	}
	if br.Attrs().Flags&net.FlagUp == 0 {
		return fmt.Errorf("bridge %s is down", m.cfg.Bridge)
	}
	return nil
}
