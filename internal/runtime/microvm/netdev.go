package microvm

import (
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/guestinit"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/bundle"
)

// tapName is the tap device QEMU makes in the sandbox's netns.
const tapName = "tap0"

// guestNet reads the address, route and MAC the network manager gave the
// sandbox's eth0: the guest takes them over, so the host's bridge, its
// nftables policy, the egress proxy and the gateway see the same sandbox
// they would see with a container.
func guestNet(nsPath string) (mac string, mtu int, addr, gw string, err error) {
	err = inNetNS(nsPath, func(h *netlink.Handle) error {
		eth, err := h.LinkByName("eth0")
		if err != nil {
			return fmt.Errorf("eth0: %w", err)
		}
		mac, mtu = eth.Attrs().HardwareAddr.String(), eth.Attrs().MTU
		addrs, err := h.AddrList(eth, netlink.FAMILY_V4)
		if err != nil || len(addrs) == 0 {
			return fmt.Errorf("eth0 has no IPv4 address (%v)", err)
		}
		addr = addrs[0].IPNet.String()
		routes, err := h.RouteList(eth, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		for _, r := range routes {
			if r.Gw != nil && (r.Dst == nil || r.Dst.IP.IsUnspecified()) {
				gw = r.Gw.String()
			}
		}
		return nil
	})
	return mac, mtu, addr, gw, err
}

// wireTap joins QEMU's tap to eth0 with a redirect each way on their
// ingress (tc mirred), so every frame passes between the guest and the
// host's bridge untouched and the netns's own stack sees none. Run after
// every QEMU start: the tap goes away with its QEMU.
func wireTap(nsPath string) error {
	return inNetNS(nsPath, func(h *netlink.Handle) error {
		eth, err := h.LinkByName("eth0")
		if err != nil {
			return fmt.Errorf("eth0: %w", err)
		}
		tap, err := h.LinkByName(tapName)
		if err != nil {
			return fmt.Errorf("QEMU's tap %s: %w", tapName, err)
		}
		if err := h.LinkSetMTU(tap, eth.Attrs().MTU); err != nil {
			return err
		}
		if err := h.LinkSetUp(tap); err != nil {
			return err
		}
		for _, p := range [][2]netlink.Link{{eth, tap}, {tap, eth}} {
			if err := redirect(h, p[0], p[1]); err != nil {
				return fmt.Errorf("redirect %s to %s: %w", p[0].Attrs().Name, p[1].Attrs().Name, err)
			}
		}
		return nil
	})
}

// redirect sends every frame arriving on from out of to.
func redirect(h *netlink.Handle, from, to netlink.Link) error {
	idx := from.Attrs().Index
	ingress := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: idx, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_INGRESS}}
	// eth0 keeps its qdisc (and a stale filter) across QEMU restarts.
	_ = h.QdiscDel(ingress)
	if err := h.QdiscAdd(ingress); err != nil {
		return err
	}
	// The host's settings frames for a restored guest (and its answers)
	// pass only between the host and QEMU's tap: none to or from the
	// bridge. A filter without actions ends classification first, so
	// they are not redirected; the netns's own stack, which has no use
	// for them, drops them (a gact drop needs a module hosts may lack).
	drop := &netlink.U32{
		FilterAttrs: netlink.FilterAttrs{LinkIndex: idx, Parent: netlink.MakeHandle(0xffff, 0), Priority: 1, Protocol: guestinit.NetEtherType},
		ClassId:     netlink.MakeHandle(1, 1),
	}
	if err := h.FilterAdd(drop); err != nil {
		return err
	}
	f := &netlink.U32{
		FilterAttrs: netlink.FilterAttrs{LinkIndex: idx, Parent: netlink.MakeHandle(0xffff, 0), Priority: 2, Protocol: unix.ETH_P_ALL},
		Actions:     []netlink.Action{netlink.NewMirredAction(to.Attrs().Index)},
	}
	return h.FilterAdd(f)
}

// inNetNS runs f with a netlink handle in the netns at path.
func inNetNS(path string, f func(*netlink.Handle) error) error {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("netns %s: %w", path, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	return f(h)
}

// guestConfig is what the guest init learns from the command line.
func guestConfig(spec runtime.Spec, addr, gw string) guestinit.Config {
	if ip, _, err := net.ParseCIDR(addr); err != nil || ip == nil {
		addr = ""
	}
	// The guest's own kernel enforces the sandbox's pids and memory: the
	// user cgroup gets them less envd's reserve, as a container's does.
	pids, mem := bundle.UserLimits(int64(spec.Resources.PIDs), int64(memoryMB(spec))<<20)
	return guestinit.Config{Hostname: spec.ID, Addr: addr, Gateway: gw, DNS: spec.DNS, UserPIDs: pids, UserMemory: mem}
}
