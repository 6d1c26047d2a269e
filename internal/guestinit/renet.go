package guestinit

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// A guest restored from another sandbox's memory image (a fork, or a
// sandbox started from a snapshot) still has the source's address and MAC.
// The host tells it the new ones in an Ethernet frame of NetEtherType sent
// straight into QEMU's tap; the guest applies them and answers with an
// acknowledgement frame. The host drops frames of this type at both ends
// of the tap's redirect, so nothing on the bridge can send or see them.
const (
	// NetEtherType is IEEE's local experimental EtherType 1.
	NetEtherType = 0x88b5
	// NetMagic starts a settings frame's payload, NetAckMagic an answer's.
	NetMagic    = "agentbox-net1\n"
	NetAckMagic = "agentbox-net-ok\n"
)

// NetSettings are the network settings a restored guest takes over.
type NetSettings struct {
	MAC     string `json:"mac"`
	Addr    string `json:"addr"`    // CIDR
	Gateway string `json:"gateway"` // default route, on-link
}

// NetFrame is an Ethernet frame of NetEtherType from src to dst carrying
// payload.
func NetFrame(dst, src []byte, payload string) []byte {
	f := make([]byte, 0, 14+len(payload))
	f = append(append(f, dst...), src...)
	f = binary.BigEndian.AppendUint16(f, NetEtherType)
	return append(f, payload...)
}

// Htons is a 16-bit value in network byte order, as AF_PACKET wants protocols.
func Htons(v uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return binary.NativeEndian.Uint16(b[:])
}

// WatchNetwork applies the settings frames arriving on eth0 until ctx ends.
// It runs in the guest's init for the guest's whole life: a memory image
// carries it, listening, into every restore.
func WatchNetwork(ctx context.Context, log *slog.Logger) error {
	eth, err := netlink.LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("eth0: %w", err)
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(Htons(NetEtherType)))
	if err != nil {
		return fmt.Errorf("packet socket: %w", err)
	}
	defer unix.Close(fd)
	go func() { <-ctx.Done(); _ = unix.Shutdown(fd, unix.SHUT_RDWR) }()
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: Htons(NetEtherType), Ifindex: eth.Attrs().Index}); err != nil {
		return fmt.Errorf("bind eth0: %w", err)
	}
	buf := make([]byte, 2048)
	for ctx.Err() == nil {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return err
		}
		if n < 14 || !bytes.HasPrefix(buf[14:n], []byte(NetMagic)) {
			continue
		}
		var s NetSettings
		if err := json.NewDecoder(bytes.NewReader(buf[14+len(NetMagic) : n])).Decode(&s); err != nil {
			log.Warn("network settings frame", "err", err)
			continue
		}
		if err := applyNet(s); err != nil {
			log.Warn("network settings", "err", err)
			continue
		}
		hw, _ := net.ParseMAC(s.MAC)
		ack := NetFrame(buf[6:12], hw, NetAckMagic+s.Addr) // back to the sender
		var dst [8]byte
		copy(dst[:], buf[6:12])
		_ = unix.Sendto(fd, ack, 0, &unix.SockaddrLinklayer{Protocol: Htons(NetEtherType), Ifindex: eth.Attrs().Index, Halen: 6, Addr: dst})
	}
	return ctx.Err()
}

// applyNet gives eth0 the MAC, address and default route of s, dropping
// the IPv4 addresses it had.
func applyNet(s NetSettings) error {
	eth, err := netlink.LinkByName("eth0")
	if err != nil {
		return err
	}
	hw, err := net.ParseMAC(s.MAC)
	if err != nil {
		return fmt.Errorf("mac: %w", err)
	}
	addr, err := netlink.ParseAddr(s.Addr)
	if err != nil {
		return fmt.Errorf("addr: %w", err)
	}
	if !bytes.Equal(eth.Attrs().HardwareAddr, hw) {
		if err := netlink.LinkSetHardwareAddr(eth, hw); err != nil {
			return fmt.Errorf("set mac: %w", err)
		}
	}
	old, err := netlink.AddrList(eth, netlink.FAMILY_V4)
	if err != nil {
		return err
	}
	for _, a := range old {
		if !a.IPNet.IP.Equal(addr.IP) {
			_ = netlink.AddrDel(eth, &a)
		}
	}
	if err := netlink.AddrReplace(eth, addr); err != nil {
		return fmt.Errorf("address: %w", err)
	}
	if s.Gateway != "" {
		gw := net.ParseIP(s.Gateway)
		if gw == nil {
			return fmt.Errorf("gateway %q is not an address", s.Gateway)
		}
		if err := netlink.RouteReplace(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: gw, Flags: int(netlink.FLAG_ONLINK)}); err != nil {
			return fmt.Errorf("default route: %w", err)
		}
	}
	return nil
}
