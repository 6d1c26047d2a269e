package main

import (
	"fmt"
	"net/netip"

	"github.com/spf13/pflag"

	"github.com/agentbox/agentbox/internal/destpolicy"
)

// fetchFlags are the serve settings of the destination policy of the
// fetches the server makes for tenants (template builds' registry pulls).
type fetchFlags struct {
	Allow []string
	Deny  []string
}

func addFetchFlags(f *pflag.FlagSet, x *fetchFlags) {
	f.StringSliceVar(&x.Allow, "fetch-allow", nil, "a destination the server may reach on a tenant's behalf (a template build's fromImage registry, its token server and blob redirects; a webhook's receiver) although it is loopback, private, link-local or this host's: host[:port], IP[:port] or CIDR, repeatable (e.g. a local registry 127.0.0.1:5000, a LAN mirror 10.0.0.0/24); without it those are refused; the sandbox subnet and --fetch-deny stay closed")
	f.StringSliceVar(&x.Deny, "fetch-deny", nil, "CIDR ranges the server never reaches on a tenant's behalf besides the always-closed ones (loopback, private, link-local and metadata, CGNAT, multicast, this host's addresses, the sandbox subnet): e.g. a cluster's pod and service ranges when they are public addresses; repeatable")
}

// policy is the destination policy: the flags plus the sandbox subnet.
func (x fetchFlags) policy(subnet netip.Prefix) (*destpolicy.Policy, error) {
	cfg := destpolicy.Config{Deny: []netip.Prefix{subnet}}
	for _, s := range x.Allow {
		a, err := destpolicy.ParseAllowed(s)
		if err != nil {
			return nil, err
		}
		cfg.Allow = append(cfg.Allow, a)
	}
	for _, s := range x.Deny {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			if a, aerr := netip.ParseAddr(s); aerr == nil {
				p, err = netip.PrefixFrom(a, a.BitLen()), nil
			}
		}
		if err != nil {
			return nil, fmt.Errorf("--fetch-deny %q: not a CIDR (e.g. 203.0.113.0/24)", s)
		}
		cfg.Deny = append(cfg.Deny, p.Masked())
	}
	return destpolicy.New(cfg), nil
}
