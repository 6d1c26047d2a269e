package network

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// noInternetSet holds the IPv4 addresses of sandboxes denied public egress.
const noInternetSet = "no_internet"

// byNameSet holds the IPv4 addresses of sandboxes whose policy allows
// domains: their connections to ports 80 and 443 go to the egress proxy
// whatever the address, since only the Host or SNI can decide them.
const byNameSet = "by_name"

// bridgesSet holds the names of the server's bridges.
const bridgesSet = "bridges"

// EgressMark is the socket mark (SO_MARK) of every connection an agentbox
// egress proxy opens on a sandbox's behalf. Each server's table refuses
// marked packets to the host's own addresses and into its sandboxes, so
// neither an address the host gained after the proxy decided nor another
// server's proxy (whose operator ranges may cover this server's subnet)
// opens a path. The same value for every server: one server's rule holds
// for all of them.
const EgressMark = 0x61620000

// privateRanges are never reachable from a sandbox, whatever its policy.
var privateRanges = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("100.64.0.0/10"), // carrier-grade NAT, often cloud-internal
}

// ifname encodes an interface name the way the kernel compares it in
// meta iifname/oifname: NUL-padded to IFNAMSIZ.
func ifname(n string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, n)
	return b
}

func iifname(name string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(name)},
	}
}

func oifname(op expr.CmpOp, name string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: op, Register: 1, Data: ifname(name)},
	}
}

func ctEstablishedRelated() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{
			SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
			Xor:  binaryutil.NativeEndian.PutUint32(0),
		},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}

func isIPv4() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
	}
}

// ipInPrefix matches the IPv4 source (offset 12) or destination (offset 16)
// address against p.
func ipInPrefix(offset uint32, p netip.Prefix) []expr.Any {
	m := make([]byte, 4)
	for i := 0; i < p.Bits(); i++ {
		m[i/8] |= 0x80 >> (i % 8)
	}
	a := p.Masked().Addr().As4()
	return append(isIPv4(),
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: m, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a[:]},
	)
}

func accept() expr.Any { return &expr.Verdict{Kind: expr.VerdictAccept} }

// Prefixes of the packets nftables logs to the egress proxy's NFLOG group
// (EgressPorts.LogGroup): what the policy refused in the kernel, and the
// first packet of each UDP or ICMP flow it let out.
const (
	LogRefused = "agentbox-refused"
	LogAllowed = "agentbox-allowed"
)

// logTo logs a packet's headers to group with prefix; nil when group is 0.
func logTo(group uint16, prefix string) []expr.Any {
	if group == 0 {
		return nil
	}
	return []expr.Any{&expr.Log{Key: 1<<unix.NFTA_LOG_GROUP | 1<<unix.NFTA_LOG_PREFIX | 1<<unix.NFTA_LOG_SNAPLEN,
		Group: group, Data: []byte(prefix), Snaplen: 64}}
}

// rejectRules turns match into two rules that refuse a packet rather than
// drop it, so a denied connection fails at once instead of waiting for a
// timeout (resolvers, curl, Xvfb...). TCP gets a reset first: the kernel
// rate-limits ICMP errors per peer (a burst of 6, then 1/s), so a sandbox
// probing a few denied addresses would otherwise see SYN timeouts. Each
// refusal is logged for the audit when the egress proxy reads the log.
func (m *Manager) rejectRules(match ...any) [][]expr.Any {
	logged := logTo(m.egressPorts.LogGroup, LogRefused)
	tcp := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
	}
	tcp = append(append(tcp, logged...), &expr.Reject{Type: unix.NFT_REJECT_TCP_RST})
	icmpx := append(append([]expr.Any(nil), logged...), &expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED})
	return [][]expr.Any{
		rule(append(match, tcp)...),
		rule(append(match, icmpx)...),
	}
}

func rule(parts ...any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		switch v := p.(type) {
		case expr.Any:
			out = append(out, v)
		case []expr.Any:
			out = append(out, v...)
		default:
			panic(fmt.Sprintf("network: bad rule part %T", p))
		}
	}
	return out
}

func ipElement(ip netip.Addr) nftables.SetElement {
	a := ip.As4()
	return nftables.SetElement{Key: a[:]}
}

// installRules replaces the inet table with a fresh copy of the sandbox
// policy in one transaction, so there is no moment without rules. Addresses
// already in the old no_internet set (sandboxes that outlived a server
// restart) are carried over, plus keep. Per-sandbox IP rules are put back by
// SetPolicy (the sandbox manager calls it for every sandbox it re-adopts).
func (m *Manager) installRules(keep, keepByName []netip.Addr) error {
	// One transaction holds every sandbox's anti-spoofing rules, and the
	// kernel acknowledges each message: past about a hundred sandboxes the
	// acknowledgements overflow a default receive buffer (ENOBUFS) and a
	// restart would fail.
	c, err := nftables.New(nftables.WithSockOptions(func(c *netlink.Conn) error { return c.SetReadBuffer(8 << 20) }))
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	old := &nftables.Table{Name: m.cfg.Table, Family: nftables.TableFamilyINet}
	elems := map[netip.Addr]bool{}
	for _, ip := range keep {
		elems[ip] = true
	}
	named := map[netip.Addr]bool{}
	for _, ip := range keepByName {
		named[ip] = true
	}
	if tables, err := c.ListTables(); err == nil {
		for _, t := range tables {
			if t.Name != m.cfg.Table {
				continue
			}
			switch t.Family {
			case nftables.TableFamilyINet:
				for name, into := range map[string]map[netip.Addr]bool{noInternetSet: elems, byNameSet: named} {
					if set, err := c.GetSetByName(old, name); err == nil {
						if es, err := c.GetSetElements(set); err == nil {
							for _, e := range es {
								if ip, ok := netip.AddrFromSlice(e.Key); ok {
									into[ip] = true
								}
							}
						}
					}
				}
				c.DelTable(old)
			case nftables.TableFamilyBridge:
				c.DelTable(t)
			}
		}
	}

	t := c.AddTable(&nftables.Table{Name: m.cfg.Table, Family: nftables.TableFamilyINet})
	set := &nftables.Set{Table: t, Name: noInternetSet, KeyType: nftables.TypeIPAddr}
	var vals []nftables.SetElement
	for ip := range elems {
		vals = append(vals, ipElement(ip))
	}
	if err := c.AddSet(set, vals); err != nil {
		return fmt.Errorf("nftables set: %w", err)
	}
	nameSet := &nftables.Set{Table: t, Name: byNameSet, KeyType: nftables.TypeIPAddr}
	vals = nil
	for ip := range named {
		vals = append(vals, ipElement(ip))
	}
	if err := c.AddSet(nameSet, vals); err != nil {
		return fmt.Errorf("nftables set: %w", err)
	}
	vmap := &nftables.Set{Table: t, Name: policyMap, IsMap: true, KeyType: nftables.TypeIPAddr, DataType: nftables.TypeVerdict}
	if err := c.AddSet(vmap, nil); err != nil {
		return fmt.Errorf("nftables map: %w", err)
	}
	accepting := nftables.ChainPolicyAccept
	input := c.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accepting})
	forward := c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accepting})
	post := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accepting})
	// policy is the sandbox's own verdict on an outbound packet the platform
	// rules let through: its allowOut/denyOut chain, then no_internet.
	policy := c.AddChain(&nftables.Chain{Name: "policy", Table: t})

	// Every bridge of the server, made or still to be made (bridges.go):
	// a sandbox on any of them is under the same rules.
	brSet := &nftables.Set{Table: t, Name: bridgesSet, KeyType: nftables.TypeIFName}
	vals = nil
	for _, n := range m.bridgeNames() {
		vals = append(vals, nftables.SetElement{Key: ifname(n)})
	}
	if err := c.AddSet(brSet, vals); err != nil {
		return fmt.Errorf("nftables set: %w", err)
	}
	onBridge := func(key expr.MetaKey, in bool) []expr.Any {
		return []expr.Any{
			&expr.Meta{Key: key, Register: 1},
			&expr.Lookup{SourceRegister: 1, SetName: brSet.Name, SetID: brSet.ID, Invert: !in},
		}
	}
	fromBr := func() []expr.Any { return onBridge(expr.MetaKeyIIFNAME, true) }
	toBr := func(in bool) []expr.Any { return onBridge(expr.MetaKeyOIFNAME, in) }
	add := func(ch *nftables.Chain, e []expr.Any) {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: e})
	}
	deny := func(ch *nftables.Chain, match ...any) {
		for _, e := range m.rejectRules(match...) {
			add(ch, e)
		}
	}
	saddr := &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4}
	add(policy, rule(isIPv4(), saddr, &expr.Lookup{SourceRegister: 1, SetName: vmap.Name, SetID: vmap.ID, IsDestRegSet: true, DestRegister: 0}))
	deny(policy, isIPv4(), saddr, &expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID})
	jumpPolicy := &expr.Verdict{Kind: expr.VerdictJump, Chain: policy.Name}

	// What an egress proxy dials for a sandbox (EgressMark) reaches neither
	// the host, on any address it has when the packet leaves (fib: no list
	// to keep in sync), nor this server's sandboxes, whichever server's
	// proxy it is.
	output := c.AddChain(&nftables.Chain{Name: "output", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter, Policy: &accepting})
	marked := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(EgressMark)},
	}
	for _, match := range [][]expr.Any{fibDaddrLocal(), toBr(true)} {
		add(output, rule(marked, match, l4Proto(unix.IPPROTO_TCP), &expr.Reject{Type: unix.NFT_REJECT_TCP_RST}))
		add(output, rule(marked, match, &expr.Verdict{Kind: expr.VerdictDrop}))
	}

	// Sandboxes reach no host listener on any host address; replies to
	// connections the host opened (gateway → envd) still pass, and so do
	// connections nftables itself redirected to the egress proxy and DNS
	// resolver (never a direct connection to their ports).
	add(input, rule(fromBr(), ctEstablishedRelated(), accept()))
	if e := m.egressPorts; e.Proxy != 0 {
		for _, pp := range []struct {
			proto byte
			port  uint16
		}{{unix.IPPROTO_TCP, e.Proxy}, {unix.IPPROTO_TCP, e.DNS}, {unix.IPPROTO_UDP, e.DNS}} {
			add(input, rule(fromBr(), ctDNAT(), ipInPrefix(16, netip.PrefixFrom(m.gateway, 32)), l4Port(pp.proto, pp.port), accept()))
		}
	}
	deny(input, fromBr())

	add(forward, rule(ctEstablishedRelated(), accept()))
	deny(forward, fromBr(), toBr(true))
	deny(forward, fromBr(), ipInPrefix(16, netip.MustParsePrefix("169.254.0.0/16")))
	// Ranges the operator opened, and the host's nameservers on port 53, are
	// reachable like the internet: subject to the sandbox's policy.
	for _, p := range m.cfg.OperatorAllow {
		add(forward, rule(fromBr(), ipInPrefix(16, p), jumpPolicy))
		add(forward, rule(fromBr(), ipInPrefix(16, p), accept()))
	}
	for _, ns := range m.dns {
		ip, err := netip.ParseAddr(ns)
		if err != nil || !ip.Is4() {
			continue
		}
		for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
			add(forward, rule(fromBr(), ipInPrefix(16, netip.PrefixFrom(ip, 32)), l4Port(proto, 53), jumpPolicy))
			add(forward, rule(fromBr(), ipInPrefix(16, netip.PrefixFrom(ip, 32)), l4Port(proto, 53), accept()))
		}
	}
	// Sandboxes allowed out still reach no private network (the LAN, the
	// cloud's internal services).
	for _, p := range privateRanges {
		deny(forward, fromBr(), ipInPrefix(16, p))
	}
	add(forward, rule(fromBr(), jumpPolicy))
	// Nothing outside the host opens connections into a sandbox.
	deny(forward, toBr(true))

	// NAT chains see the first packet of each flow only: every UDP or ICMP
	// flow the policy let out is logged once (TCP goes through the proxy,
	// which records it).
	if lg := logTo(m.egressPorts.LogGroup, LogAllowed); lg != nil {
		add(post, rule(ipInPrefix(12, m.cfg.Subnet), toBr(false),
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{unix.IPPROTO_TCP}}, lg))
	}
	add(post, rule(ipInPrefix(12, m.cfg.Subnet), toBr(false), &expr.Masq{}))

	if e := m.egressPorts; e.Proxy != 0 {
		// Denied TCP fails at the SYN, before the redirect below: a reset
		// from here is "connection refused" to the sandbox, where a proxy
		// that accepted and then reset would be a socket that opened and
		// died. What reaches the proxy is what the policy allows by
		// address, and ports 80 and 443 of sandboxes whose domains only the
		// Host or SNI can decide; what reaches the resolver is a query to
		// the gateway or to an address the policy allows.
		pf := c.AddChain(&nftables.Chain{Name: "prefilter", Table: t, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityMangle, Policy: &accepting})
		add(pf, rule(fromBr(), ctEstablishedRelated(), accept()))
		// The sandbox's own nameserver: the resolver at the gateway, which
		// answers only the names the policy allows.
		gw := ipInPrefix(16, netip.PrefixFrom(m.gateway, 32))
		add(pf, rule(fromBr(), gw, l4Port(unix.IPPROTO_TCP, 53), accept()))
		add(pf, rule(fromBr(), gw, l4Port(unix.IPPROTO_UDP, 53), accept()))
		// What the NAT chain below redirects (TCP, and DNS over UDP) is
		// decided here first, by where it was sent: a query to an outside
		// nameserver is a connection to that address like any other, so
		// with the internet off it fails as every denied destination does.
		for _, r := range []struct {
			match []expr.Any
			tcp   bool
		}{{l4Proto(unix.IPPROTO_TCP), true}, {l4Port(unix.IPPROTO_UDP, 53), false}} {
			redirected, tcp := r.match, r.tcp
			// The host on any of its addresses, whenever it got them (the
			// gateway too; fib looks each packet up, no list to keep),
			// link-local and metadata addresses, other sandboxes.
			deny(pf, fromBr(), redirected, fibDaddrLocal())
			deny(pf, fromBr(), redirected, ipInPrefix(16, netip.MustParsePrefix("169.254.0.0/16")))
			deny(pf, fromBr(), redirected, ipInPrefix(16, m.cfg.Subnet))
			byName := func(match ...any) {
				if !tcp {
					return
				}
				for _, port := range []uint16{80, 443} {
					add(pf, rule(append(match, fromBr(), isIPv4(), saddr,
						&expr.Lookup{SourceRegister: 1, SetName: nameSet.Name, SetID: nameSet.ID},
						l4Port(unix.IPPROTO_TCP, port), accept())...))
				}
			}
			for _, p := range m.cfg.OperatorAllow {
				byName(ipInPrefix(16, p))
				add(pf, rule(fromBr(), redirected, ipInPrefix(16, p), jumpPolicy))
				add(pf, rule(fromBr(), redirected, ipInPrefix(16, p), accept()))
			}
			for _, p := range append(privateRanges, netip.MustParsePrefix("224.0.0.0/3"), netip.MustParsePrefix("0.0.0.0/8")) {
				deny(pf, fromBr(), redirected, ipInPrefix(16, p))
			}
			byName()
			add(pf, rule(fromBr(), redirected, jumpPolicy))
		}

		// Every TCP connection and DNS query a sandbox opens goes to the host's
		// egress proxy and resolver, which apply the policy by name and
		// address and record each one. The proxy refuses the host, private
		// ranges and other sandboxes as the forward chain does.
		pre := c.AddChain(&nftables.Chain{Name: "prerouting", Table: t, Type: nftables.ChainTypeNAT,
			Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest, Policy: &accepting})
		add(pre, rule(fromBr(), isIPv4(), l4Port(unix.IPPROTO_UDP, 53), redirectTo(e.DNS)))
		add(pre, rule(fromBr(), isIPv4(), l4Port(unix.IPPROTO_TCP, 53), redirectTo(e.DNS)))
		add(pre, rule(fromBr(), isIPv4(), l4Proto(unix.IPPROTO_TCP), redirectTo(e.Proxy)))
	}

	// Anti-spoofing, on the bridge ports themselves: a sandbox sends only
	// from its own address, so no rule keyed on a source address (here or in
	// the egress proxy) can be fooled by another sandbox.
	bt := c.AddTable(&nftables.Table{Name: m.cfg.Table, Family: nftables.TableFamilyBridge})
	bpre := c.AddChain(&nftables.Chain{Name: "prerouting", Table: bt, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityFilter, Policy: &accepting})
	ports, pairs := spoofSets(bt)
	var portVals, pairVals []nftables.SetElement
	m.mu.Lock()
	for id, ep := range m.endpoints {
		port, pair := spoofElements(m.hostVeth(id), ep.IP)
		portVals, pairVals = append(portVals, port), append(pairVals, pair)
	}
	m.ipChains = map[string]bool{}
	m.mu.Unlock()
	if err := c.AddSet(ports, portVals); err != nil {
		return fmt.Errorf("nftables set: %w", err)
	}
	if err := c.AddSet(pairs, pairVals); err != nil {
		return fmt.Errorf("nftables set: %w", err)
	}
	for _, r := range spoofRules(bt, bpre, ports, pairs) {
		c.AddRule(r)
	}

	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables table %s: %w", m.cfg.Table, err)
	}
	return nil
}

// policyMap maps a sandbox address to a jump into its own chain.
const policyMap = "policies"

func l4Proto(proto byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
	}
}

func l4Port(proto byte, port uint16) []expr.Any {
	return append(l4Proto(proto),
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
	)
}

// fibDaddrLocal matches packets addressed to one of the host's own
// addresses.
func fibDaddrLocal() []expr.Any {
	return []expr.Any{
		&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)},
	}
}

// ctDNAT matches connections whose destination nftables rewrote.
func ctDNAT() []expr.Any {
	const ipsDstNAT = 1 << 5
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATUS},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(ipsDstNAT), Xor: binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}

// redirectTo sends the packet to port on the address of the interface it
// came in on: the bridge's gateway address.
func redirectTo(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
		&expr.Redir{RegisterProtoMin: 1, RegisterProtoMax: 1},
	}
}

// The anti-spoofing sets of the bridge table: the host ends of the
// server's sandboxes, and each one with its sandbox's address. Elements,
// not a rule per sandbox: adding and removing one is exact (removing rules
// needs a listing of them all, which the kernel may cut short while other
// sandboxes change them, and which grows with every sandbox), and a frame
// is checked with two hash lookups however many sandboxes there are.
const (
	portsSet     = "ports"
	portAddrsSet = "port_addrs"
)

func spoofSets(t *nftables.Table) (ports, pairs *nftables.Set) {
	return &nftables.Set{Table: t, Name: portsSet, KeyType: nftables.TypeIFName},
		&nftables.Set{Table: t, Name: portAddrsSet, KeyType: nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeIPAddr), Concatenation: true}
}

func spoofElements(port string, ip netip.Addr) (nftables.SetElement, nftables.SetElement) {
	a := ip.As4()
	return nftables.SetElement{Key: ifname(port)}, nftables.SetElement{Key: append(ifname(port), a[:]...)}
}

// spoofRules drop frames from a sandbox's bridge port that carry another
// source address (IPv4 or ARP), and every other protocol. Ports that are
// not the server's (another server's, the host's own) are left alone.
func spoofRules(t *nftables.Table, ch *nftables.Chain, ports, pairs *nftables.Set) []*nftables.Rule {
	onPort := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Lookup{SourceRegister: 1, SetName: ports.Name, SetID: ports.ID},
	}
	proto := func(ethertype uint16) []expr.Any {
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeyPROTOCOL, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(ethertype)},
		}
	}
	// The port's name and the address at offset, concatenated in the
	// 32-bit registers (8: NFT_REG32_00; the name takes four), are not a
	// pair of the set.
	notPair := func(offset uint32) []expr.Any {
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 8},
			&expr.Payload{DestRegister: 12, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
			&expr.Lookup{SourceRegister: 8, SetName: pairs.Name, SetID: pairs.ID, Invert: true},
		}
	}
	drop := &expr.Verdict{Kind: expr.VerdictDrop}
	return []*nftables.Rule{
		{Table: t, Chain: ch, Exprs: rule(onPort, proto(unix.ETH_P_IP), notPair(12), drop)},
		// ARP sender protocol address: after htype, ptype, hlen, plen, oper
		// and the 6-byte sender hardware address.
		{Table: t, Chain: ch, Exprs: rule(onPort, proto(unix.ETH_P_ARP), notPair(14), drop)},
		{Table: t, Chain: ch, Exprs: rule(onPort,
			&expr.Meta{Key: expr.MetaKeyPROTOCOL, Register: 1},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.BigEndian.PutUint16(unix.ETH_P_IP)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.BigEndian.PutUint16(unix.ETH_P_ARP)},
			drop)},
	}
}

func bridgeTable(cfg Config) (*nftables.Table, *nftables.Chain) {
	t := &nftables.Table{Name: cfg.Table, Family: nftables.TableFamilyBridge}
	return t, &nftables.Chain{Name: "prerouting", Table: t}
}

// addSpoofRules puts one sandbox's port and address in the anti-spoofing
// sets.
func (m *Manager) addSpoofRules(id string, ip netip.Addr) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	t, _ := bridgeTable(m.cfg)
	ports, pairs := spoofSets(t)
	port, pair := spoofElements(m.hostVeth(id), ip)
	// The pair first: a port in the set without it is a port whose every
	// frame is dropped, never one that is let through.
	if err := c.SetAddElements(pairs, []nftables.SetElement{pair}); err != nil {
		return fmt.Errorf("nftables anti-spoofing set: %w", err)
	}
	if err := c.SetAddElements(ports, []nftables.SetElement{port}); err != nil {
		return fmt.Errorf("nftables anti-spoofing set: %w", err)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables anti-spoofing sets (is Setup done?): %w", err)
	}
	return nil
}

// removeSpoofRules takes what addSpoofRules added out of the sets; what is
// not there is not an error.
func (m *Manager) removeSpoofRules(id string, ip netip.Addr) error {
	t, _ := bridgeTable(m.cfg)
	ports, pairs := spoofSets(t)
	port, pair := spoofElements(m.hostVeth(id), ip)
	for _, e := range []struct {
		set *nftables.Set
		el  nftables.SetElement
	}{{ports, port}, {pairs, pair}} {
		c, err := nftables.New()
		if err != nil {
			return fmt.Errorf("nftables: %w", err)
		}
		if err := c.SetDeleteElements(e.set, []nftables.SetElement{e.el}); err != nil {
			return fmt.Errorf("nftables anti-spoofing set: %w", err)
		}
		if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("nftables anti-spoofing set %s: %w", e.set.Name, err)
		}
	}
	return nil
}

// ipChainName names a sandbox's allowOut/denyOut chain.
func ipChainName(id string) string { return "sb_" + legacyHostVeth(id)[2:] }

// setIPRules replaces the sandbox's own chain: allowOut prefixes accept,
// denyOut prefixes reject; what matches neither falls through to
// no_internet. A sandbox without such lists has no chain at all.
func (m *Manager) setIPRules(id string, ip netip.Addr, p Policy) error {
	m.mu.Lock()
	had := m.ipChains[id]
	m.mu.Unlock()
	if !had && !p.HasIPRules() {
		return nil
	}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	t := &nftables.Table{Name: m.cfg.Table, Family: nftables.TableFamilyINet}
	vmap := &nftables.Set{Table: t, Name: policyMap, IsMap: true, KeyType: nftables.TypeIPAddr, DataType: nftables.TypeVerdict}
	ch := &nftables.Chain{Name: ipChainName(id), Table: t}
	if had {
		if err := c.SetDeleteElements(vmap, []nftables.SetElement{ipElement(ip)}); err != nil {
			return fmt.Errorf("nftables map: %w", err)
		}
		c.FlushChain(ch)
		c.DelChain(ch)
	}
	if p.HasIPRules() {
		c.AddChain(ch)
		for _, a := range p.AllowOut {
			c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: rule(ipInPrefix(16, a), accept())})
		}
		for _, d := range p.DenyOut {
			for _, e := range m.rejectRules(ipInPrefix(16, d)) {
				c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: e})
			}
		}
		el := ipElement(ip)
		el.VerdictData = &expr.Verdict{Kind: expr.VerdictJump, Chain: ch.Name}
		if err := c.SetAddElements(vmap, []nftables.SetElement{el}); err != nil {
			return fmt.Errorf("nftables map: %w", err)
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables rules of %s (is Setup done?): %w", id, err)
	}
	m.mu.Lock()
	if p.HasIPRules() {
		m.ipChains[id] = true
	} else {
		delete(m.ipChains, id)
	}
	m.mu.Unlock()
	return nil
}

// setNoInternet adds or removes ip from the no_internet set.
func (m *Manager) setNoInternet(ip netip.Addr, deny bool) error {
	return m.setMember(noInternetSet, ip, deny)
}

// setMember adds ip to, or removes it from, the named address set.
func (m *Manager) setMember(name string, ip netip.Addr, in bool) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	t := &nftables.Table{Name: m.cfg.Table, Family: nftables.TableFamilyINet}
	set, err := c.GetSetByName(t, name)
	if err != nil {
		return fmt.Errorf("nftables set %s (is Setup done?): %w", name, err)
	}
	el := []nftables.SetElement{ipElement(ip)}
	if in {
		err = c.SetAddElements(set, el)
	} else {
		err = c.SetDeleteElements(set, el)
	}
	if err != nil {
		return fmt.Errorf("nftables set %s: %w", name, err)
	}
	if err := c.Flush(); err != nil {
		if !in && errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("nftables set %s: %w", name, err)
	}
	return nil
}

func (m *Manager) readNoInternet() ([]netip.Addr, error) { return m.readSet(noInternetSet) }

func (m *Manager) readSet(name string) ([]netip.Addr, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, err
	}
	set, err := c.GetSetByName(&nftables.Table{Name: m.cfg.Table, Family: nftables.TableFamilyINet}, name)
	if err != nil {
		return nil, err
	}
	es, err := c.GetSetElements(set)
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, e := range es {
		if ip, ok := netip.AddrFromSlice(e.Key); ok {
			out = append(out, ip)
		}
	}
	return out, nil
}

func nftablesConn() (*nftables.Conn, error) { return nftables.New() }

func tableOf(cfg Config) *nftables.Table {
	return &nftables.Table{Name: cfg.Table, Family: nftables.TableFamilyINet}
}
