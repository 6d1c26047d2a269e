package egress

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"net/netip"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/network"
)

// Traffic the proxy never sees is recorded from nftables' log: a TCP
// connection refused at its SYN, and UDP or ICMP the policy let out or
// refused. nftables sends those packets' headers to an NFLOG group this
// file reads (nfnetlink_log), and each becomes an egress audit record,
// within the sandbox's audit rate.

// nfnetlink_log message and attribute numbers (linux/netfilter/nfnetlink_log.h).
const (
	nfulnlMsgPacket  = 0
	nfulnlMsgConfig  = 1
	nfulaCfgCmd      = 1
	nfulaCfgMode     = 2
	nfulnlCfgCmdBind = 1
	nfulnlCopyPacket = 2
	nfulaPayload     = 9
	nfulaPrefix      = 10
	// nflogSnaplen is enough for an IPv4 header with options and the
	// ports.
	nflogSnaplen = 64
	// nflogReadBuffer holds about 30,000 logged packets.
	nflogReadBuffer = 8 << 20
)

// openNFLog binds a netlink socket to a free NFLOG group, trying groups
// derived from seed first so restarts of one server usually get the same.
func openNFLog(seed string) (*netlink.Conn, uint16, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return nil, 0, fmt.Errorf("nflog: %w", err)
	}
	// A flood of refused connections is a burst of log messages: past the
	// socket's buffer the kernel drops them, and with them the record of
	// the one connection that mattered. SetReadBuffer is capped by
	// net.core.rmem_max; the server is root, so the size is forced.
	_ = c.SetReadBuffer(nflogReadBuffer)
	if raw, err := c.SyscallConn(); err == nil {
		_ = raw.Control(func(fd uintptr) {
			_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, nflogReadBuffer)
		})
	}
	h := fnv.New32a()
	h.Write([]byte(seed))
	start := uint16(1000 + h.Sum32()%30000)
	for i := range uint16(64) {
		g := start + i
		err = nflogConfig(c, g, netlink.Attribute{Type: nfulaCfgCmd, Data: []byte{nfulnlCfgCmdBind}})
		if errors.Is(err, unix.EBUSY) {
			continue
		}
		if err != nil {
			break
		}
		mode := make([]byte, 6)
		binary.BigEndian.PutUint32(mode, nflogSnaplen)
		mode[4] = nfulnlCopyPacket
		if err = nflogConfig(c, g, netlink.Attribute{Type: nfulaCfgMode, Data: mode}); err != nil {
			break
		}
		return c, g, nil
	}
	c.Close()
	return nil, 0, fmt.Errorf("nflog: bind a group: %w", err)
}

// nflogConfig sends one configuration message for group and waits for its
// acknowledgement, skipping packets that arrive meanwhile.
func nflogConfig(c *netlink.Conn, group uint16, attr netlink.Attribute) error {
	attrs, err := netlink.MarshalAttributes([]netlink.Attribute{attr})
	if err != nil {
		return err
	}
	data := append([]byte{unix.AF_UNSPEC, 0, byte(group >> 8), byte(group)}, attrs...)
	req, err := c.Send(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_ULOG<<8 | nfulnlMsgConfig), Flags: netlink.Request | netlink.Acknowledge},
		Data:   data,
	})
	if err != nil {
		return err
	}
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	defer c.SetReadDeadline(time.Time{})
	for {
		msgs, err := c.Receive()
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Header.Type == netlink.Error && m.Header.Sequence == req.Header.Sequence {
				return nil // an error code would have come back as err
			}
		}
	}
}

// watchNFLog turns logged packets into audit records until c is closed.
func (s *Server) watchNFLog(c *netlink.Conn) {
	for {
		msgs, err := c.Receive()
		if err != nil {
			if errors.Is(err, unix.ENOBUFS) {
				// The kernel dropped log messages: a flood outran us. The
				// window's rows say their counts are "at least".
				s.nflogDropped.Store(true)
				s.log.Debug("nflog: messages dropped by the kernel")
				continue
			}
			return
		}
		for _, m := range msgs {
			if m.Header.Type != netlink.HeaderType(unix.NFNL_SUBSYS_ULOG<<8|nfulnlMsgPacket) || len(m.Data) < 4 {
				continue
			}
			ad, err := netlink.NewAttributeDecoder(m.Data[4:])
			if err != nil {
				continue
			}
			var prefix string
			var pkt []byte
			for ad.Next() {
				switch ad.Type() {
				case nfulaPrefix:
					prefix = ad.String()
				case nfulaPayload:
					pkt = ad.Bytes()
				}
			}
			s.logged(prefix, pkt)
		}
	}
}

// logged records one packet nftables logged with prefix.
func (s *Server) logged(prefix string, pkt []byte) {
	if len(pkt) < 20 || pkt[0]>>4 != 4 {
		return
	}
	ihl := int(pkt[0]&0x0f) * 4
	src := netip.AddrFrom4([4]byte(pkt[12:16]))
	dst := netip.AddrFrom4([4]byte(pkt[16:20]))
	var port uint16
	proto := fmt.Sprintf("ip/%d", pkt[9])
	switch pkt[9] {
	case unix.IPPROTO_TCP, unix.IPPROTO_UDP:
		if len(pkt) >= ihl+4 {
			port = binary.BigEndian.Uint16(pkt[ihl+2 : ihl+4])
		}
		proto = map[byte]string{unix.IPPROTO_TCP: "tcp", unix.IPPROTO_UDP: "udp"}[pkt[9]]
	case unix.IPPROTO_ICMP:
		proto = "icmp"
	}
	b := s.lookup(src)
	if b == nil {
		return
	}
	e := &connEvent{start: time.Now(), b: b, dst: netip.AddrPortFrom(dst, port), proto: proto}
	switch prefix {
	case network.LogAllowed:
		v := b.policy.DecideIP(dst)
		e.allow, e.rule = true, v.Rule
	case network.LogRefused:
		if e.rule = s.platformDenied(dst); e.rule == "" {
			e.rule = b.policy.DecideIP(dst).Rule
		}
	default:
		return
	}
	s.record(context.Background(), e, "connect", map[string]any{"at": "kernel"})
}
