package network

import (
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
)

// The host keeps one ARP entry per sandbox on the bridge, in the host-wide
// IPv4 neighbour table. Its default thresholds (gc_thresh2 512, gc_thresh3
// 1024) are far below what a /22 or the default /16 holds: past 512 entries
// the kernel evicts live ones and past 1024 refuses new ones ("neighbour
// table overflow"), and envd's health checks and creates stall for seconds
// at about 550 sandboxes. The server raises them (never lowers them) to fit
// every address of its subnet (a /24 fits the kernel's defaults).
const neighSysctl = "/proc/sys/net/ipv4/neigh/default/"

// neighbourThresholds returns gc_thresh2 and gc_thresh3 that fit a subnet of
// hosts addresses next to the host's other neighbours, given the current
// values; unchanged values mean nothing to write.
func neighbourThresholds(hosts, cur2, cur3 int) (int, int) {
	// Eviction starts past gc_thresh2: every sandbox fits under it with
	// room for the host's other neighbours; the hard cap is twice that.
	want2 := hosts + 256
	return max(cur2, want2), max(cur3, 2*want2)
}

// raiseNeighbourTable raises the host's neighbour table thresholds to fit
// subnet.
func raiseNeighbourTable(subnet netip.Prefix) error {
	hosts := 1 << min(32-subnet.Bits(), 20)
	read := func(name string) (int, error) {
		b, err := os.ReadFile(neighSysctl + name)
		if err != nil {
			return 0, err
		}
		return strconv.Atoi(strings.TrimSpace(string(b)))
	}
	cur2, err := read("gc_thresh2")
	if err != nil {
		return fmt.Errorf("neighbour table: %w", err)
	}
	cur3, err := read("gc_thresh3")
	if err != nil {
		return fmt.Errorf("neighbour table: %w", err)
	}
	new2, new3 := neighbourThresholds(hosts, cur2, cur3)
	// gc_thresh3 first: the kernel does not check the order, but a reader
	// never sees thresh2 above thresh3 this way.
	for _, s := range []struct {
		name     string
		cur, val int
	}{{"gc_thresh3", cur3, new3}, {"gc_thresh2", cur2, new2}} {
		if s.val == s.cur {
			continue
		}
		if err := os.WriteFile(neighSysctl+s.name, []byte(strconv.Itoa(s.val)), 0o644); err != nil {
			return fmt.Errorf("raise the neighbour table's %s to %d for subnet %s: %w", s.name, s.val, subnet, err)
		}
	}
	return nil
}
