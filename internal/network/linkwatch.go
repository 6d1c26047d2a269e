package network

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
)

// A veth end that gets its carrier after it was opened cannot carry a
// packet yet: its queue is still the kernel's noop qdisc, which drops every
// packet sent (drop reason QDISC_DROP), and its bridge port stays disabled,
// which drops every frame received (BRIDGE_INGRESS_STP_STATE). Both change
// only when the kernel's linkwatch work runs for the device (dev_activate,
// then the NETDEV_CHANGE on which the bridge enables the port), from a
// shared workqueue that a loaded host runs late, so the first packet of a
// new sandbox, either way, was often lost and TCP resent its SYN a second
// later. The host end is opened first, before eth0 gives it a carrier; the
// bridge goes through the same when its first port comes up. RTM_GETLINK
// for one device runs that device's pending linkwatch work at once (Linux
// 6.8 and later), so activate asks for each device in turn and checks what
// the work sets; on an older kernel it waits for the workqueue.

// settleTimeout bounds the wait for linkwatch on a kernel that does not
// run it on request; past it the sandbox still works, its first packet
// may be resent.
const settleTimeout = 2 * time.Second

// brportForwarding is a bridge port's state in sysfs once it forwards.
const brportForwarding = "3"

// activate makes sandbox id's link ready to carry its first packet: the
// host end's queue and bridge port, the bridge's queue and eth0's queue
// (h is a netlink handle in the sandbox's netns). It runs after eth0 is up.
func (m *Manager) activate(ctx context.Context, h *netlink.Handle, id string) error {
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, settleTimeout)
	defer cancel()
	host := m.hostVeth(id)
	_, bridge := m.bridgeOfID(id)
	steps := []struct {
		what  string
		ready func() (bool, error)
	}{
		{"host end " + host, func() (bool, error) {
			l, err := netlink.LinkByName(host)
			if err != nil {
				return false, err
			}
			b, err := os.ReadFile("/sys/class/net/" + host + "/brport/state")
			if err != nil {
				return false, err
			}
			return l.Attrs().OperState == netlink.OperUp && strings.TrimSpace(string(b)) == brportForwarding, nil
		}},
		{"bridge " + bridge, func() (bool, error) {
			l, err := netlink.LinkByName(bridge)
			if err != nil {
				return false, err
			}
			return l.Attrs().OperState == netlink.OperUp, nil
		}},
		{"eth0", func() (bool, error) {
			l, err := h.LinkByName("eth0")
			if err != nil {
				return false, err
			}
			return l.Attrs().OperState == netlink.OperUp, nil
		}},
	}
	for _, s := range steps {
		for {
			ok, err := s.ready()
			if err != nil {
				return fmt.Errorf("sandbox %s link: %s: %w", id, s.what, err)
			}
			if ok {
				break
			}
			select {
			case <-ctx.Done():
				if err := parent.Err(); err != nil {
					return fmt.Errorf("sandbox %s link: %s: %w", id, s.what, err)
				}
				m.log.Warn("link not active yet; the sandbox's first packet may be resent", "id", id, "link", s.what)
				return nil
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	return nil
}
