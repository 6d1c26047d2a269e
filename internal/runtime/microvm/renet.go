package microvm

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/confine"
	"github.com/agentbox/agentbox/internal/guestinit"
)

// renumber gives a guest restored from another sandbox's memory the MAC and
// address of its own netns's eth0 (guestinit.WatchNetwork): settings
// frames go into QEMU's tap until the guest acknowledges one.
func renumber(ctx context.Context, nsPath, mac, addr, gw string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var fd, tapIdx int
	if err := inNetNS(nsPath, func(h *netlink.Handle) error {
		tap, err := h.LinkByName(tapName)
		if err != nil {
			return fmt.Errorf("QEMU's tap %s: %w", tapName, err)
		}
		tapIdx = tap.Attrs().Index
		return nil
	}); err != nil {
		return err
	}
	// Every frame on the tap (ETH_P_ALL): those are seen before the tap's
	// ingress filter drops the guest's answer.
	if err := runInNetNS(nsPath, func() (err error) {
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(guestinit.Htons(unix.ETH_P_ALL)))
		return err
	}); err != nil {
		return fmt.Errorf("packet socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: guestinit.Htons(unix.ETH_P_ALL), Ifindex: tapIdx}); err != nil {
		return fmt.Errorf("bind %s: %w", tapName, err)
	}
	tv := unix.NsecToTimeval((250 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return err
	}
	hw, err := net.ParseMAC(mac)
	if err != nil {
		return err
	}
	b, _ := json.Marshal(guestinit.NetSettings{MAC: mac, Addr: addr, Gateway: gw})
	// From a locally administered address of no one, to everyone: the
	// guest may still answer to its old MAC.
	src := []byte{0x02, 0, 0, 0, 0, 1}
	frame := guestinit.NetFrame([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, src, guestinit.NetMagic+string(b))
	buf := make([]byte, 2048)
	for {
		if err := unix.Sendto(fd, frame, 0, &unix.SockaddrLinklayer{Ifindex: tapIdx, Halen: 6, Addr: [8]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}}); err != nil {
			return fmt.Errorf("send settings: %w", err)
		}
		deadline := time.Now().Add(500 * time.Millisecond)
		for time.Now().Before(deadline) {
			n, from, err := unix.Recvfrom(fd, buf, 0)
			if err != nil {
				if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
					continue
				}
				return err
			}
			if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
				continue
			}
			if n > 14 && binary.BigEndian.Uint16(buf[12:14]) == guestinit.NetEtherType &&
				bytes.Equal(buf[6:12], hw) && bytes.HasPrefix(buf[14:n], []byte(guestinit.NetAckMagic+addr)) {
				return nil
			}
		}
		if ctx.Err() != nil {
			return fmt.Errorf("the guest did not take its new address %s: %w", addr, ctx.Err())
		}
	}
}

// writeSeed replaces the guest's settings on a writable disk that no VM
// runs on (a copy for a new sandbox), so a fresh boot of it takes them.
// The disk is the guest's own writing: e2fsck and debugfs parse it as the
// sandbox's unprivileged uid inside internal/confine (no network, no other
// file, limits, seccomp), never as host root.
func (d *Driver) writeSeed(ctx context.Context, id, disk string, gc guestinit.Config) error {
	if d.cfg.HookBinary == "" {
		return errors.New("microvm: Config.HookBinary is required to edit a guest disk")
	}
	uid, err := d.sandboxUID(id)
	if err != nil {
		return err
	}
	b, _ := json.Marshal(gc)
	// The settings, handed to debugfs as a descriptor: a pipe has no
	// path for it to reopen, so an unlinked private file it is.
	seed, err := os.CreateTemp(filepath.Dir(disk), ".seed-*")
	if err != nil {
		return err
	}
	os.Remove(seed.Name())
	defer seed.Close()
	if _, err := seed.Write(b); err != nil {
		return err
	}
	img, err := os.OpenFile(disk, os.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer img.Close()
	fi, err := img.Stat()
	if err != nil {
		return err
	}
	// The tool reopens the disk by /proc/self/fd, which checks its owner:
	// the copy is the sandbox's uid's while it runs (QEMU, as that uid,
	// is handed it read-write anyway), root's again after.
	if err := img.Chown(uid, uid); err != nil {
		return err
	}
	defer img.Chown(0, 0)
	if err := seed.Chown(uid, uid); err != nil {
		return err
	}
	run := func(stdin string, argv ...string) ([]byte, error) {
		return confine.Tool{
			Self: d.cfg.HookBinary, UID: uid, GID: uid, Argv: argv,
			Files: []*os.File{img, seed}, Stdin: strings.NewReader(stdin),
			Limits: confine.Limits{FileSize: uint64(fi.Size())},
		}.Run(ctx)
	}
	e2fsck, err := exec.LookPath("e2fsck")
	if err != nil {
		return err
	}
	debugfs, err := exec.LookPath("debugfs")
	if err != nil {
		return err
	}
	// The guest's journal may hold the latest root directory: replay it
	// first, as the guest's kernel would at mount (debugfs does not).
	if out, err := run("", e2fsck, "-E", "journal_only", "-p", confine.FD(0)); err != nil {
		if ee, ok := errors.AsType[*exec.ExitError](err); !ok || ee.ExitCode() > 1 {
			return fmt.Errorf("e2fsck on the disk of sandbox %s: %w: %s", id, err, confine.Output(out))
		}
	}
	script := fmt.Sprintf("rm /%s\nwrite %s /%s\n", guestinit.ConfigFile, confine.FD(1), guestinit.ConfigFile)
	if out, err := run(script, debugfs, "-w", "-f", "-", confine.FD(0)); err != nil {
		return fmt.Errorf("debugfs on the disk of sandbox %s: %w: %s", id, err, confine.Output(out))
	}
	out, err := run("", debugfs, "-R", "cat /"+guestinit.ConfigFile, confine.FD(0))
	if err != nil || !bytes.Contains(out, b) {
		return fmt.Errorf("debugfs on the disk of sandbox %s: the guest's settings were not written (%v): %s", id, err, confine.Output(out))
	}
	return nil
}

// copyDisk copies a writable disk, sharing blocks where the filesystem
// can (reflink) and leaving holes where the disk has them.
func copyDisk(ctx context.Context, src, dst string) error {
	out, err := exec.CommandContext(ctx, "cp", "--sparse=always", "--reflink=auto", src, dst).CombinedOutput()
	if err != nil {
		return fmt.Errorf("copy disk %s: %w: %s", src, err, strings.TrimSpace(string(out)))
	}
	return os.Chmod(dst, 0o600)
}
