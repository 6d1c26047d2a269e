package runsc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	gorunc "github.com/containerd/go-runc"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/bundle"
	"github.com/agentbox/agentbox/internal/runtime/ocicli"
)

// Files of the runsc tier's checkpoint support. runsc writes its image as
// checkpoint.img + pages*.img (no CRIU inventory); netConfFile keeps the
// sandbox's eth0 addresses and routes, which runsc --network=sandbox moves
// into its own netstack and removes from the netns at run and at restore.
const (
	runscImageFile = "checkpoint.img"
	runscPagesMeta = "pages_meta.img"
	netConfFile    = "netns.json"
)

// netConf is what runsc strips from the netns and what a restore in the
// same netns needs back: its netstack reads the netns configuration then.
type netConf struct {
	Addrs  []string `json:"addrs"` // CIDR
	Routes []route  `json:"routes"`
}

type route struct {
	Dst  string `json:"dst,omitempty"` // CIDR; "" is the default route
	Gw   string `json:"gw,omitempty"`
	Link bool   `json:"link,omitempty"` // scope link
}

// withEth0 runs f with a netlink handle inside the bundle's netns and its eth0.
func withEth0(dir string, f func(h *netlink.Handle, eth netlink.Link) error) error {
	path, err := bundle.NetNSPath(dir)
	if err != nil {
		return err
	}
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("netns %s: %w", path, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("netlink in %s: %w", path, err)
	}
	defer h.Close()
	eth, err := h.LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("eth0 in %s: %w", path, err)
	}
	return f(h, eth)
}

// saveNetConf records the netns's eth0 configuration in the bundle before
// runsc takes it away (run, restore into a fresh netns).
func saveNetConf(dir string) error {
	var c netConf
	err := withEth0(dir, func(h *netlink.Handle, eth netlink.Link) error {
		addrs, err := h.AddrList(eth, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			c.Addrs = append(c.Addrs, a.IPNet.String())
		}
		routes, err := h.RouteList(eth, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		for _, rt := range routes {
			var r route
			if rt.Dst != nil && !(rt.Dst.IP.IsUnspecified() && isZeroMask(rt.Dst.Mask)) {
				r.Dst = rt.Dst.String()
			}
			if rt.Gw != nil {
				r.Gw = rt.Gw.String()
			}
			r.Link = rt.Scope == netlink.SCOPE_LINK
			c.Routes = append(c.Routes, r)
		}
		return nil
	})
	if errors.Is(err, bundle.ErrNoNetNS) {
		return nil
	}
	if err != nil {
		return err
	}
	if len(c.Addrs) == 0 {
		// Already taken by runsc: keep what an earlier save recorded.
		return nil
	}
	b, _ := json.Marshal(c)
	return os.WriteFile(filepath.Join(dir, netConfFile), b, 0o600)
}

func isZeroMask(m net.IPMask) bool {
	ones, _ := m.Size()
	return ones == 0
}

// restoreNetConf puts back what saveNetConf recorded; entries still there
// are kept. Routes are added after the addresses, link routes first.
func restoreNetConf(dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, netConfFile))
	if err != nil {
		return fmt.Errorf("no recorded network configuration for the restore: %w", err)
	}
	var c netConf
	if err := json.Unmarshal(b, &c); err != nil {
		return err
	}
	return withEth0(dir, func(h *netlink.Handle, eth netlink.Link) error {
		for _, a := range c.Addrs {
			addr, err := netlink.ParseAddr(a)
			if err != nil {
				return err
			}
			if err := h.AddrAdd(eth, addr); err != nil && !errors.Is(err, unix.EEXIST) {
				return fmt.Errorf("eth0 address %s: %w", a, err)
			}
		}
		if err := h.LinkSetUp(eth); err != nil {
			return err
		}
		for _, pass := range []bool{true, false} {
			for _, r := range c.Routes {
				if r.Link != pass {
					continue
				}
				nr := &netlink.Route{LinkIndex: eth.Attrs().Index}
				if r.Link {
					nr.Scope = netlink.SCOPE_LINK
				}
				if r.Dst != "" {
					_, dst, err := net.ParseCIDR(r.Dst)
					if err != nil {
						return err
					}
					nr.Dst = dst
				}
				if r.Gw != "" {
					nr.Gw = net.ParseIP(r.Gw)
				}
				if err := h.RouteAdd(nr); err != nil && !errors.Is(err, unix.EEXIST) {
					return fmt.Errorf("eth0 route %+v: %w", r, err)
				}
			}
		}
		return nil
	})
}

// Checkpoint saves the sandbox. gVisor saves its whole kernel (processes,
// memory, sockets) with `runsc checkpoint`; the rootfs stays on the host
// overlay (--overlay2=none), so a resume in place finds its files where
// they were, and a copy for snapshots is taken while the sandbox is paused,
// the same instant as the image.
func (d *Driver) Checkpoint(ctx context.Context, id string, opts runtime.CheckpointOptions) (err error) {
	dir, err := d.BundleOf(id)
	if err != nil {
		return err
	}
	if opts.FilesystemOnly {
		return d.b.FSCheckpoint(ctx, id, opts, d)
	}
	// A later pause (of this sandbox or of a fork) needs the netns config.
	if _, serr := os.Stat(filepath.Join(dir, netConfFile)); serr != nil {
		return fmt.Errorf("sandbox %s: created before gvisor checkpoints were supported (no %s): %w", id, netConfFile, errdefs.ErrUnavailable)
	}
	img, own, drop, err := d.DumpImage(id, opts)
	if err != nil {
		return err
	}
	defer drop(&err)
	logFile := filepath.Join(dir, "runsc-checkpoint.log")
	c, err := d.Client(logFile)
	if err != nil {
		return err
	}
	frozen, err := d.FreezeForDump(ctx, id, opts)
	if err != nil {
		return err
	}
	defer frozen.Thaw(&err)
	var actions []gorunc.CheckpointAction
	if opts.LeaveRunning {
		actions = append(actions, gorunc.LeaveRunning)
	}
	if err := c.Checkpoint(ctx, d.CID(id), &gorunc.CheckpointOpts{ImagePath: img}, actions...); err != nil {
		return fmt.Errorf("sandbox %s: %w", id, d.Failed("checkpoint", logFile, err))
	}
	if opts.UpperCopy != "" {
		if err := d.b.CaptureUpper(ctx, id, opts.UpperCopy); err != nil {
			return err
		}
	}
	if !opts.LeaveRunning {
		frozen.Gone()
		// runsc checkpoint returns while the sandbox winds down; the
		// container record must go before a restore under the same id.
		if err := d.waitStopped(ctx, id); err != nil {
			return fmt.Errorf("sandbox %s: %w", id, err)
		}
		if err := d.DeleteContainer(ctx, id); err != nil {
			return fmt.Errorf("sandbox %s: %w", id, err)
		}
		// Give the idle netns its address back now: a server restarted
		// while the sandbox is paused learns the sandbox's network from it.
		if err := restoreNetConf(dir); err != nil {
			d.log.Warn("paused gvisor sandbox: netns address not restored; a server restart will not find its network", "id", id, "err", err)
		}
	}
	if own {
		return bundle.CommitImage(dir, img, id)
	}
	return nil
}

// waitStopped waits until runsc reports the container stopped or gone.
func (d *Driver) waitStopped(ctx context.Context, id string) error {
	deadline := time.Now().Add(30 * time.Second)
	for delay := 5 * time.Millisecond; ; delay = min(delay*2, 100*time.Millisecond) {
		st, err := d.ContainerState(ctx, id)
		if err != nil {
			if !d.ContainerExists(ctx, id) {
				return nil
			}
			return fmt.Errorf("runsc state %s: %w", id, err)
		}
		if st.Status == "stopped" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("runsc: sandbox still %q after its checkpoint", st.Status)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
	}
}

// Restore brings a sandbox back: in place (resume) after the netns got its
// address back, or into a new bundle and netns (fork, snapshot), where
// gVisor's netstack takes the new address by itself.
func (d *Driver) Restore(ctx context.Context, spec runtime.Spec, opts runtime.RestoreOptions) error {
	return d.Base.Restore(spec, opts, func(inPlace bool) error { return d.fsRestore(ctx, spec, inPlace) },
		func(dir, img string, inPlace bool) error { return d.restoreMemory(ctx, spec, dir, img, inPlace) })
}

// restoreMemory restores sandbox spec.ID from the memory image img.
func (d *Driver) restoreMemory(ctx context.Context, spec runtime.Spec, dir, img string, inPlace bool) (err error) {
	if d.cfg.Net != nil && !inPlace {
		// A new sandbox joins a netns of the host's user namespace.
		if err := d.cfg.Net.Plug(ctx, spec.ID, 0); err != nil {
			return fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
	}
	if _, err := os.Stat(filepath.Join(img, runscImageFile)); err != nil {
		return fmt.Errorf("sandbox %s: no gvisor checkpoint image at %s: %w", spec.ID, img, errdefs.ErrNotFound)
	}
	logFile := filepath.Join(dir, "runsc-restore.log")
	c, err := d.Client(logFile)
	if err != nil {
		return err
	}
	var rb bundle.Rollback
	defer func() {
		if err != nil {
			rb.Run()
		}
	}()
	if !inPlace {
		o := options()
		if rb, err = d.b.BuildFromImage(ctx, spec, o, 0); err != nil {
			return err
		}
		if err := bundle.SetTier(dir, Name); err != nil {
			return err
		}
		// runsc checks that the restore spec matches the checkpointed one,
		// so the new bundle gets the same hardened spec a Create writes.
		if err := bundle.WriteConfig(dir, d.b.HardenedSpec(spec, dir, o, 0)); err != nil {
			return err
		}
		if err := saveNetConf(dir); err != nil {
			return fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
	} else {
		if err := bundle.EnsureRootfs(dir); err != nil {
			return fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
		if err := restoreNetConf(dir); err != nil {
			return fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
	}
	err = ocicli.NullIO(func(io gorunc.IO) error {
		_, err := c.Restore(ctx, d.CID(spec.ID), dir, &gorunc.RestoreOpts{CheckpointOpts: gorunc.CheckpointOpts{ImagePath: img}, IO: io, Detach: true})
		return err
	})
	if err != nil {
		_ = d.DeleteContainer(context.WithoutCancel(ctx), spec.ID)
		return fmt.Errorf("sandbox %s: %w", spec.ID, d.Failed("restore", logFile, err))
	}
	return nil
}

// fsRestore boots the sandbox fresh: in place on its bundle (whose rootfs
// still has its writable layer), or as a new sandbox whose top layer is the
// captured one.
func (d *Driver) fsRestore(ctx context.Context, spec runtime.Spec, inPlace bool) error {
	if !inPlace {
		return d.Create(ctx, spec)
	}
	return d.BootInPlace(ctx, spec.ID, restoreNetConf, func(dir string) error { return d.start(ctx, spec.ID, dir) })
}

// HasCheckpoint reports whether the sandbox has a complete pause image; a
// checkpoint interrupted after runsc finished is completed.
func (d *Driver) HasCheckpoint(ctx context.Context, id string) (bool, error) {
	return d.b.HasImage(ctx, id, runscHasImage, runscHasImage, func(ctx context.Context) bool { return d.FinishDump(ctx, id) })
}

// DropCheckpoint removes the sandbox's pause image.
func (d *Driver) DropCheckpoint(ctx context.Context, id string) error {
	return d.b.DropImage(id)
}

// runscHasImage reports whether dir holds a complete runsc image.
func runscHasImage(dir string) bool {
	for _, f := range []string{runscImageFile, runscPagesMeta} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return false
		}
	}
	return true
}
