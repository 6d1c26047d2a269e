package network

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// userNetNSProcess starts a process in a new user namespace (root = host uid
// 100000) and a network namespace owned by it, as runc makes a sandbox's.
func userNetNSProcess(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	m := []syscall.SysProcIDMap{{ContainerID: 0, HostID: 100000, Size: 65536}}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWUSER | unix.CLONE_NEWNET,
		UidMappings: m, GidMappings: m,
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd.Process.Pid
}

// reachable reports whether the host can connect to a listener in the
// sandbox netns at path through the sandbox's address ip.
func reachable(t *testing.T, path string, ip netip.Addr) error {
	t.Helper()
	l := inNetNS(t, path, func() net.Listener { return listen(t, ":0") })
	defer l.Close()
	return dial(netip.AddrPortFrom(ip, uint16(l.Addr().(*net.TCPAddr).Port)).String())
}

// checkSeededNeighbours checks the ARP entries Plug and Attach write before
// a sandbox's first packet: the host's for ip (the sandbox's MAC) on the
// bridge, and the netns at path's for the gateway (the bridge's MAC).
func checkSeededNeighbours(t *testing.T, m *Manager, id, path string, ip netip.Addr) {
	t.Helper()
	br, err := netlink.LinkByName(m.cfg.Bridge)
	if err != nil {
		t.Fatal(err)
	}
	hasEntry := func(neighs []netlink.Neigh, err error, ip netip.Addr, mac net.HardwareAddr) string {
		if err != nil {
			return err.Error()
		}
		for _, n := range neighs {
			if a, _ := netip.AddrFromSlice(n.IP.To4()); a == ip {
				if n.HardwareAddr.String() == mac.String() && n.State&(netlink.NUD_REACHABLE|netlink.NUD_STALE|netlink.NUD_DELAY|netlink.NUD_PROBE) != 0 {
					return ""
				}
				return fmt.Sprintf("%s is %s in state %#x, want %s", ip, n.HardwareAddr, n.State, mac)
			}
		}
		return fmt.Sprintf("no entry for %s", ip)
	}
	hostNeighs, err := netlink.NeighList(br.Attrs().Index, netlink.FAMILY_V4)
	if msg := hasEntry(hostNeighs, err, ip, sandboxMAC(id)); msg != "" {
		t.Errorf("host's neighbour table on %s: %s", m.cfg.Bridge, msg)
	}
	msg := inNetNS(t, path, func() string {
		eth, err := netlink.LinkByName("eth0")
		if err != nil {
			return err.Error()
		}
		neighs, err := netlink.NeighList(eth.Attrs().Index, netlink.FAMILY_V4)
		return hasEntry(neighs, err, m.gateway, br.Attrs().HardwareAddr)
	})
	if msg != "" {
		t.Errorf("sandbox's neighbour table: %s", msg)
	}
}

func TestDeferredPlug(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig(t)
	cfg.Bridge, cfg.Subnet, cfg.Table = "abplug0", netip.MustParsePrefix("10.96.0.0/24"), "agentbox_plug_test"
	cfg.Deferred = true
	m := startManager(t, cfg)

	for _, tc := range []struct {
		name   string
		userNS bool
	}{
		{"netns made by the manager", false},
		{"netns owned by the sandbox's user namespace", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "plug" + strconv.FormatBool(tc.userNS)
			ep, err := m.Attach(ctx, id, Policy{AllowInternet: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = m.Detach(ctx, id) })
			if !ep.Deferred || isNetNS(ep.NetNSPath) {
				t.Fatalf("endpoint %+v: want a deferred placeholder", ep)
			}
			pid := 0
			if tc.userNS {
				pid = userNetNSProcess(t)
			}
			if err := m.Plug(ctx, id, pid); err != nil {
				t.Fatal(err)
			}
			if err := m.Plug(ctx, id, pid); err != nil {
				t.Fatalf("second Plug: %v", err)
			}
			if !isNetNS(ep.NetNSPath) {
				t.Fatal("netns not pinned on its file")
			}
			if tc.userNS {
				got, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid))
				var st unix.Stat_t
				if err := unix.Stat(ep.NetNSPath, &st); err != nil || !strings.Contains(got, strconv.FormatUint(st.Ino, 10)) {
					t.Fatalf("pinned netns is not the process's (%s): %v", got, err)
				}
			}
			// Before any packet: ARP would otherwise have taught both.
			checkSeededNeighbours(t, m, id, ep.NetNSPath, ep.IP)
			if err := reachable(t, ep.NetNSPath, ep.IP); err != nil {
				t.Fatalf("host cannot reach the sandbox: %v", err)
			}
			eth := inNetNS(t, ep.NetNSPath, func() string {
				i, err := net.InterfaceByName("eth0")
				if err != nil {
					return err.Error()
				}
				return i.HardwareAddr.String()
			})
			if eth != sandboxMAC(id).String() {
				t.Errorf("eth0 MAC %s, want %s", eth, sandboxMAC(id))
			}
		})
	}

	// A checkpointed sandbox's netns goes away (Unplug) and a restore gets
	// a new, empty one that the hook wires up before its sockets return.
	t.Run("unplug and plug a restored netns", func(t *testing.T) {
		id := "plughook"
		ep, err := m.Attach(ctx, id, Policy{AllowInternet: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Detach(ctx, id) })
		if err := m.Plug(ctx, id, userNetNSProcess(t)); err != nil {
			t.Fatal(err)
		}
		if err := m.Unplug(ctx, id); err != nil {
			t.Fatal(err)
		}
		if isNetNS(ep.NetNSPath) {
			t.Fatal("netns still pinned after Unplug")
		}
		if _, err := os.Stat(ep.NetNSPath); err != nil {
			t.Fatalf("netns file gone after Unplug (the sandbox must stay attached): %v", err)
		}
		// A restore's netns: runc's plug-wait hook has the server Plug it.
		pid := userNetNSProcess(t)
		if err := m.Plug(ctx, id, pid); err != nil {
			t.Fatalf("Plug of the restored netns: %v", err)
		}
		path := fmt.Sprintf("/proc/%d/ns/net", pid)
		deadline := time.Now().Add(5 * time.Second)
		for reachable(t, path, ep.IP) != nil && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if err := reachable(t, path, ep.IP); err != nil {
			t.Fatalf("host cannot reach the restored netns after Plug: %v", err)
		}
		if err := m.Plug(ctx, id, pid); err != nil {
			t.Fatalf("Plug again: %v", err)
		}
	})

	t.Run("hostile ids", func(t *testing.T) {
		for _, id := range []string{"../x", "", "a b"} {
			if err := m.Plug(ctx, id, 0); err == nil {
				t.Errorf("Plug(%q) accepted", id)
			}
		}
		if err := m.Plug(ctx, "notattached", 0); err == nil {
			t.Error("Plug of an unattached sandbox accepted")
		}
	})
}
