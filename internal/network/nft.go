package network

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// noInternetSet holds the IPv4 addresses of sandboxes denied public egress.
const noInternetSet = "no_internet"

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

// rejectRules turns match into two rules that refuse a packet rather than
// drop it, so a denied connection fails at once instead of waiting for a
// timeout (resolvers, curl, Xvfb...). TCP gets a reset first: the kernel
// rate-limits ICMP errors per peer (a burst of 6, then 1/s), so a sandbox
// probing a few denied addresses would otherwise see SYN timeouts.
func rejectRules(match ...any) [][]expr.Any {
	tcp := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Reject{Type: unix.NFT_REJECT_TCP_RST},
	}
	icmpx := &expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED}
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
// restart) are carried over, plus keep.
func (m *Manager) installRules(keep []netip.Addr) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	old := &nftables.Table{Name: m.cfg.Table, Family: nftables.TableFamilyINet}
	elems := map[netip.Addr]bool{}
	for _, ip := range keep {
		elems[ip] = true
	}
	if tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet); err == nil {
		for _, t := range tables {
			if t.Name != m.cfg.Table {
				continue
			}
			if set, err := c.GetSetByName(old, noInternetSet); err == nil {
				if es, err := c.GetSetElements(set); err == nil {
					for _, e := range es {
						if ip, ok := netip.AddrFromSlice(e.Key); ok {
							elems[ip] = true
						}
					}
				}
			}
			c.DelTable(old)
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
	accepting := nftables.ChainPolicyAccept
	input := c.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accepting})
	forward := c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accepting})
	post := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accepting})

	br := m.cfg.Bridge
	add := func(ch *nftables.Chain, e []expr.Any) {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: e})
	}
	deny := func(ch *nftables.Chain, match ...any) {
		for _, e := range rejectRules(match...) {
			add(ch, e)
		}
	}
	// Sandboxes reach no host listener on any host address; replies to
	// connections the host opened (gateway → envd) still pass.
	add(input, rule(iifname(br), ctEstablishedRelated(), accept()))
	deny(input, iifname(br))

	add(forward, rule(ctEstablishedRelated(), accept()))
	deny(forward, iifname(br), oifname(expr.CmpOpEq, br))
	deny(forward, iifname(br), ipInPrefix(16, netip.MustParsePrefix("169.254.0.0/16")))
	deny(forward, iifname(br), isIPv4(),
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID},
		oifname(expr.CmpOpNeq, br))
	// Sandboxes allowed out still reach no private network (the LAN, the
	// cloud's internal services) except the host's nameservers they are
	// given in resolv.conf.
	for _, ns := range m.dns {
		ip, err := netip.ParseAddr(ns)
		if err != nil || !ip.Is4() {
			continue
		}
		for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
			add(forward, rule(iifname(br), ipInPrefix(16, netip.PrefixFrom(ip, 32)),
				&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(53)},
				accept()))
		}
	}
	for _, p := range privateRanges {
		deny(forward, iifname(br), ipInPrefix(16, p))
	}
	// Nothing outside the host opens connections into a sandbox.
	deny(forward, oifname(expr.CmpOpEq, br))

	add(post, rule(ipInPrefix(12, m.cfg.Subnet), oifname(expr.CmpOpNeq, br), &expr.Masq{}))

	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables table %s: %w", m.cfg.Table, err)
	}
	return nil
}

// setNoInternet adds or removes ip from the no_internet set.
func (m *Manager) setNoInternet(ip netip.Addr, deny bool) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	t := &nftables.Table{Name: m.cfg.Table, Family: nftables.TableFamilyINet}
	set, err := c.GetSetByName(t, noInternetSet)
	if err != nil {
		return fmt.Errorf("nftables set %s (is Setup done?): %w", noInternetSet, err)
	}
	el := []nftables.SetElement{ipElement(ip)}
	if deny {
		err = c.SetAddElements(set, el)
	} else {
		err = c.SetDeleteElements(set, el)
	}
	if err != nil {
		return fmt.Errorf("nftables set %s: %w", noInternetSet, err)
	}
	if err := c.Flush(); err != nil {
		if !deny && errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("nftables set %s: %w", noInternetSet, err)
	}
	return nil
}

func (m *Manager) readNoInternet() ([]netip.Addr, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, err
	}
	set, err := c.GetSetByName(&nftables.Table{Name: m.cfg.Table, Family: nftables.TableFamilyINet}, noInternetSet)
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
