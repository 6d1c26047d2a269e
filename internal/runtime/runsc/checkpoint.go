package runc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
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

// netnsPath reads the network namespace path from the bundle's config.json.
func netnsPath(dir string) (string, error) {
	ns, err := readBundleNS(dir)
	if err != nil {
		return "", err
	}
	if ns.netPath == "" {
		return "", fmt.Errorf("bundle %s: %w", dir, errNoNetNS)
	}
	return ns.netPath, nil
}

// errNoNetNS: the sandbox runs in a netns runsc creates itself (tests).
var errNoNetNS = errors.New("no network namespace path")

// withEth0 runs f with a netlink handle inside the bundle's netns and its eth0.
func withEth0(dir string, f func(h *netlink.Handle, eth netlink.Link) error) error {
	path, err := netnsPath(dir)
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
	if errors.Is(err, errNoNetNS) {
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

// runscCheckpoint is Checkpoint for the runsc tier. gVisor saves its whole
// kernel (processes, memory, sockets) with `runsc checkpoint`; the rootfs
// stays on the host overlay (--overlay2=none), so a resume in place finds
// its files where they were, and a copy for snapshots is taken while the
// sandbox is paused, the same instant as the image.
func (r *Runtime) runscCheckpoint(ctx context.Context, id string, opts runtime.CheckpointOptions) (err error) {
	dir := r.dir(id)
	img, own, err := r.imageDir(id, opts)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil && own {
			_ = os.RemoveAll(img)
		}
	}()
	// A later pause (of this sandbox or of a fork) needs the netns config.
	if _, serr := os.Stat(filepath.Join(dir, netConfFile)); serr != nil {
		return fmt.Errorf("sandbox %s: created before gvisor checkpoints were supported (no %s): %w", id, netConfFile, errdefs.ErrUnavailable)
	}
	frozen := false
	if opts.UpperCopy != "" || opts.LeaveRunning {
		if _, err := r.runsc(ctx, "", "pause", id); err != nil {
			return fmt.Errorf("sandbox %s: %w", id, err)
		}
		frozen = true
		defer func() {
			if frozen {
				if _, terr := r.runsc(context.WithoutCancel(ctx), "", "resume", id); terr != nil {
					err = errors.Join(err, terr)
				}
			}
		}()
	}
	args := []string{"checkpoint", "--image-path", img}
	if opts.LeaveRunning {
		args = append(args, "--leave-running")
	}
	args = append(args, id)
	if _, err := r.runsc(ctx, filepath.Join(dir, "runsc-checkpoint.log"), args...); err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	if opts.UpperCopy != "" {
		if err := r.captureUpper(ctx, id, opts.UpperCopy); err != nil {
			return err
		}
	}
	if !opts.LeaveRunning {
		frozen = false
		// runsc checkpoint returns while the sandbox winds down; the
		// container record must go before a restore under the same id.
		if err := r.runscWaitStopped(ctx, id); err != nil {
			return fmt.Errorf("sandbox %s: %w", id, err)
		}
		if _, err := r.runsc(ctx, "", "delete", "--force", id); err != nil && !notExist(err) {
			return fmt.Errorf("sandbox %s: %w", id, err)
		}
		// Give the idle netns its address back now: a server restarted
		// while the sandbox is paused learns the sandbox's network from it.
		if err := restoreNetConf(dir); err != nil {
			r.log.Warn("paused gvisor sandbox: netns address not restored; a server restart will not find its network", "id", id, "err", err)
		}
	}
	if own {
		return commitImage(dir, img, id)
	}
	return nil
}

// runscWaitStopped waits until runsc reports the container stopped or gone.
func (r *Runtime) runscWaitStopped(ctx context.Context, id string) error {
	deadline := time.Now().Add(30 * time.Second)
	for delay := 5 * time.Millisecond; ; delay = min(delay*2, 100*time.Millisecond) {
		out, err := r.runsc(ctx, "", "state", id)
		if err != nil {
			if notExist(err) {
				return nil
			}
			return err
		}
		var st struct {
			Status string `json:"status"`
		}
		if json.Unmarshal(out, &st) == nil && st.Status == "stopped" {
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

// runscRestore is Restore for the runsc tier: in place (resume) after the
// netns got its address back, or into a new bundle and netns (fork,
// snapshot), where gVisor's netstack takes the new address by itself.
func (r *Runtime) runscRestore(ctx context.Context, spec runtime.Spec, opts runtime.RestoreOptions, inPlace bool, img string) (err error) {
	dir := r.dir(spec.ID)
	if _, err := os.Stat(filepath.Join(img, runscImageFile)); err != nil {
		return fmt.Errorf("sandbox %s: no gvisor checkpoint image at %s: %w", spec.ID, img, errdefs.ErrNotFound)
	}
	var rb rollback
	defer func() {
		if err != nil {
			rb.run()
		}
	}()
	if !inPlace {
		if rb, err = r.newBundle(ctx, spec, runtime.RestoreOptions{}, 0); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, tierFile), []byte(TierRunsc+"\n"), 0o600); err != nil {
			return err
		}
		// runsc checks that the restore spec matches the checkpointed one,
		// so the new bundle gets the same hardened spec a Create writes.
		cfgJSON, err := json.MarshalIndent(r.harden(r.ociSpec(spec, dir, 0), spec), "", "\t")
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "config.json"), cfgJSON, 0o600); err != nil {
			return err
		}
		if err := saveNetConf(dir); err != nil {
			return fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
	} else {
		if err := r.ensureRootfs(dir); err != nil {
			return fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
		if err := restoreNetConf(dir); err != nil {
			return fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
	}
	if _, err := r.runsc(ctx, filepath.Join(dir, "runsc-restore.log"), "restore", "--detach", "--image-path", img, "--bundle", dir, spec.ID); err != nil {
		_, _ = r.runsc(context.WithoutCancel(ctx), "", "delete", "--force", spec.ID)
		return fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	return nil
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
