package network

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	goruntime "runtime"
	"strconv"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// A sandbox in a user namespace must get a network namespace owned by that
// user namespace: only then does root in the sandbox administer its own
// network (sysfs, low ports) and can CRIU checkpoint it. Such a netns can
// only be made by the runtime, together with the user namespace, so with
// Config.Deferred, Attach records the address and rules only, and the
// runtime hands the new netns over with Plug before the sandbox's init
// runs, which makes the veth pair with the sandbox's end inside. runc has
// CRIU restore a sandbox into an empty netns; its plug-wait hook has the
// server Plug that netns before the sockets come back, and Plug corrects
// what differs (a fork's address and MAC).

// peerVeth names the sandbox's end of its veth pair while it waits in the
// host namespace for Plug to move it in as eth0.
func (m *Manager) peerVeth(id string) string { return "ap" + m.hostVeth(id)[2:] }

// sandboxMAC is eth0's address, derived from the id: stable across a pause
// (the bridge and neighbours keep their entries) and different for each
// fork of one image, which would otherwise share the source's.
func sandboxMAC(id string) net.HardwareAddr {
	h := sha256.Sum256([]byte("mac:" + id))
	h[0] = h[0]&0xfe | 0x02 // unicast, locally administered
	return net.HardwareAddr(h[:6])
}

// placeholder creates the empty netns file of a deferred sandbox.
func placeholder(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("%s: %w", path, errdefs.ErrConflict)
		}
		return err
	}
	return f.Close()
}

// attachNetNS connects the netns at path to the bridge: a veth pair made
// with the sandbox's end already inside as eth0, then configured.
func (m *Manager) attachNetNS(ctx context.Context, id, path string, ip netip.Addr) error {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("open netns: %w", err)
	}
	defer ns.Close()
	if err := m.addVeth(id, "eth0", int(ns)); err != nil {
		return err
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("netlink in netns: %w", err)
	}
	defer h.Close()
	if err := m.configureInside(h, id, ip); err != nil {
		return err
	}
	if err := m.seedNeighbours(h, id, ip); err != nil {
		return err
	}
	return m.activate(ctx, h, id)
}

// forgetNeighbour drops the host's neighbour (ARP) entry for ip on the
// bridge: an address is reused by a sandbox with another MAC (next-fit
// spreads reuse out, but a restarted server starts over), and a stale
// entry would send the new sandbox's first packets to the old MAC for
// seconds, past envd's start deadline.
func (m *Manager) forgetNeighbour(id string, ip netip.Addr) {
	_, name := m.bridgeOfID(id)
	br, err := netlink.LinkByName(name)
	if err != nil {
		return
	}
	n := &netlink.Neigh{LinkIndex: br.Attrs().Index, Family: netlink.FAMILY_V4, IP: ip.AsSlice()}
	if err := netlink.NeighDel(n); err != nil && !errors.Is(err, unix.ENOENT) {
		m.log.Debug("forget neighbour entry", "ip", ip, "err", err)
	}
}

// addVeth creates the pair: the host end on the bridge, isolated and up,
// the other named peer, in the netns open as fd nsFD (-1: the host's).
func (m *Manager) addVeth(id, peer string, nsFD int) error {
	br, err := m.bridgeFor(id)
	if err != nil {
		return fmt.Errorf("%w: %w", err, errdefs.ErrUnavailable)
	}
	hostName := m.hostVeth(id)
	veth := &netlink.Veth{
		LinkAttrs: netlink.LinkAttrs{Name: hostName, MTU: br.Attrs().MTU, MasterIndex: br.Attrs().Index},
		PeerName:  peer, PeerHardwareAddr: sandboxMAC(id),
	}
	if nsFD >= 0 {
		veth.PeerNamespace = netlink.NsFd(nsFD)
	}
	if err := netlink.LinkAdd(veth); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("veth %s exists: %w", hostName, errdefs.ErrConflict)
		}
		return fmt.Errorf("create veth: %w", err)
	}
	host, err := netlink.LinkByName(hostName)
	if err == nil {
		// Second wall behind the forward rule: the bridge itself never
		// passes frames between two sandbox ports.
		err = netlink.LinkSetIsolated(host, true)
		if err == nil {
			err = netlink.LinkSetUp(host)
		}
	}
	if err != nil {
		_ = deleteLink(hostName)
		return fmt.Errorf("veth %s: %w", hostName, err)
	}
	return nil
}

// Plug hands sandbox id's network namespace to the manager: the one of
// process pid (made by the runtime in the sandbox's user namespace, or by
// CRIU on a restore), or with pid 0 a fresh one in the host's user
// namespace (sandboxes not in one). The namespace is pinned on the
// sandbox's netns file, the veth's sandbox end is moved in as eth0 if it
// is not there yet, and address, MAC, routes and sysctls are made to match
// this sandbox. Plugging again (after a restore) is safe.
func (m *Manager) Plug(ctx context.Context, id string, pid int) error {
	if !validID.MatchString(id) {
		return fmt.Errorf("sandbox id %q: %w", id, errdefs.ErrInvalidArgument)
	}
	ep, ok := m.Lookup(id)
	if !ok {
		return fmt.Errorf("sandbox %s network: %w", id, errdefs.ErrNotFound)
	}
	path := m.nsPath(id)
	switch {
	case pid > 0:
		_ = unix.Unmount(path, unix.MNT_DETACH) // an earlier, dead namespace
		if err := unix.Mount("/proc/"+strconv.Itoa(pid)+"/ns/net", path, "none", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("pin netns of %s: %w", id, err)
		}
	case !isNetNS(path):
		if err := pinHostNetNS(path); err != nil {
			return fmt.Errorf("netns %s: %w", id, err)
		}
	}
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("open netns: %w", err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("netlink in netns: %w", err)
	}
	defer h.Close()
	if pid > 0 {
		// A netns made with the sandbox (not by newNetNS) has not had
		// the sandbox sysctls yet; a restored one may have lost some.
		// Before eth0 arrives, which takes the "default" ones.
		if err := runInNetNS(path, netnsSysctls); err != nil {
			return err
		}
	}
	if _, err := h.LinkByName("eth0"); err != nil {
		if err := m.plugVeth(id, ns, h); err != nil {
			return err
		}
	}
	if err := m.configureInside(h, id, ep.IP); err != nil {
		return err
	}
	if err := m.seedNeighbours(h, id, ep.IP); err != nil {
		return err
	}
	return m.activate(ctx, h, id)
}

// seedNeighbours writes the ARP entries of a sandbox's first exchange with
// the host before it happens: the host's for the sandbox's address (its
// MAC is known, sandboxMAC) and the sandbox's for the gateway (the
// bridge's MAC), both REACHABLE, so they age and are checked again like
// learnt ones. The first connection (envd's health check) then needs no
// ARP round trip, whose loss on a just-plugged veth the kernel repairs only
// after a second (retrans_time_ms). h is a netlink handle in the sandbox's
// netns.
func (m *Manager) seedNeighbours(h *netlink.Handle, id string, ip netip.Addr) error {
	_, name := m.bridgeOfID(id)
	br, err := netlink.LinkByName(name)
	if err != nil {
		return fmt.Errorf("bridge %s: %w", name, err)
	}
	if err := netlink.NeighSet(&netlink.Neigh{LinkIndex: br.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_REACHABLE,
		IP: ip.AsSlice(), HardwareAddr: sandboxMAC(id)}); err != nil {
		return fmt.Errorf("neighbour entry of %s on %s: %w", ip, name, err)
	}
	eth, err := h.LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("eth0: %w", err)
	}
	if err := h.NeighSet(&netlink.Neigh{LinkIndex: eth.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_REACHABLE,
		IP: m.gateway.AsSlice(), HardwareAddr: br.Attrs().HardwareAddr}); err != nil {
		return fmt.Errorf("sandbox's neighbour entry of the gateway %s: %w", m.gateway, err)
	}
	return nil
}

// plugVeth gives the netns open as ns (h: a netlink handle in it) its end
// of the sandbox's veth pair as eth0. A pair is made with that end already
// inside: moving a device between namespaces waits for an RCU grace period
// (10-25 ms on a busy host), creating it there does not. A pair already
// waiting in the host (made by an earlier server's Attach) is moved in
// instead.
func (m *Manager) plugVeth(id string, ns netns.NsHandle, h *netlink.Handle) error {
	peer := m.peerVeth(id)
	l, err := netlink.LinkByName(peer)
	if err != nil {
		// A host end without its peer is the remains of a pair whose
		// other end went away with a netns: start over.
		if err := deleteLink(m.hostVeth(id)); err != nil {
			return err
		}
		return m.addVeth(id, "eth0", int(ns))
	}
	if err := netlink.LinkSetNsFd(l, int(ns)); err != nil {
		return fmt.Errorf("move veth into netns: %w", err)
	}
	if l, err = h.LinkByName(peer); err == nil {
		err = h.LinkSetName(l, "eth0")
	}
	if err != nil {
		return fmt.Errorf("veth %s as eth0: %w", peer, err)
	}
	return nil
}

// Unplug drops the manager's hold on a sandbox's netns whose processes are
// gone (checkpointed): the namespace and its veth pair go away with it,
// which frees the names for the restore. The netns file stays, so the
// sandbox remains attached (address, rules) across restarts.
func (m *Manager) Unplug(ctx context.Context, id string) error {
	if !validID.MatchString(id) {
		return fmt.Errorf("sandbox id %q: %w", id, errdefs.ErrInvalidArgument)
	}
	if err := unix.Unmount(m.nsPath(id), unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unpin netns of %s: %w", id, err)
	}
	// The netns may outlive the unmount for a moment (a closing socket);
	// deleting the host end takes the pair down now.
	return deleteLink(m.hostVeth(id))
}

// isNetNS reports whether path is a pinned namespace (not a placeholder).
func isNetNS(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == unix.NSFS_MAGIC
}

// runInNetNS runs fn on a thread inside the netns at path.
func runInNetNS(path string, fn func() error) error {
	target, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("open netns: %w", err)
	}
	defer target.Close()
	return onThread(func() error {
		if err := netns.Set(target); err != nil {
			return fmt.Errorf("enter netns: %w", err)
		}
		return nil
	}, fn)
}

// onThread runs enter (which moves the thread into another netns) and then
// fn on a locked OS thread, and switches the thread back to its netns. If
// that fails the thread stays locked, so Go discards it rather than reuse a
// thread in the wrong namespace.
func onThread(enter, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		goruntime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		if err = enter(); err == nil {
			err = fn()
		}
		if serr := netns.Set(orig); serr != nil {
			errc <- errors.Join(err, fmt.Errorf("restore thread netns: %w", serr))
			return // the thread stays locked and dies with the goroutine
		}
		goruntime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}

// configureInside makes eth0 and lo in the sandbox netns match sandbox id:
// its MAC, the address as a /32 with an on-link route to the gateway only,
// so every packet, including one for another sandbox, goes through the host
// and its nftables rules and a forbidden connection is rejected at once
// instead of timing out on ARP. Other addresses on eth0 (a fork's source's)
// are removed. h works in the sandbox netns.
func (m *Manager) configureInside(h *netlink.Handle, id string, ip netip.Addr) error {
	return configureLinks(h, sandboxMAC(id), ip, m.gateway)
}

// configureLinks brings lo up and gives eth0 its MAC, ip as its only
// address and the routes through gw (see configureInside).
func configureLinks(h *netlink.Handle, mac net.HardwareAddr, ip, gateway netip.Addr) error {
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("lo: %w", err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("lo up: %w", err)
	}
	eth, err := h.LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("eth0: %w", err)
	}
	if eth.Attrs().HardwareAddr.String() != mac.String() {
		if err := h.LinkSetHardwareAddr(eth, mac); err != nil {
			return fmt.Errorf("eth0 MAC: %w", err)
		}
	}
	want := &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(32, 32)}}
	addrs, err := h.AddrList(eth, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("eth0 addresses: %w", err)
	}
	have := false
	for _, a := range addrs {
		if a.IPNet.String() == want.IPNet.String() {
			have = true
			continue
		}
		if err := h.AddrDel(eth, &a); err != nil {
			return fmt.Errorf("eth0: drop address %s: %w", a.IPNet, err)
		}
	}
	if !have {
		if err := h.AddrAdd(eth, want); err != nil {
			return fmt.Errorf("eth0 address: %w", err)
		}
	}
	if err := h.LinkSetUp(eth); err != nil {
		return fmt.Errorf("eth0 up: %w", err)
	}
	gw := gateway.AsSlice()
	if err := h.RouteReplace(&netlink.Route{LinkIndex: eth.Attrs().Index, Scope: netlink.SCOPE_LINK,
		Dst: &net.IPNet{IP: gw, Mask: net.CIDRMask(32, 32)}}); err != nil {
		return fmt.Errorf("gateway route: %w", err)
	}
	if err := h.RouteReplace(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: gw}); err != nil {
		return fmt.Errorf("default route: %w", err)
	}
	return nil
}
