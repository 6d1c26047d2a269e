// Package guestinit is the first process of a microVM sandbox's guest
// kernel: envd, started by the kernel as /init of the initrd the microvm
// tier builds. It loads the virtio modules Debian's kernel ships as
// modules, mounts the template's read-only root disk under the sandbox's
// writable disk as an overlay, sets up the network the host put on the
// kernel command line, switches to that root and runs envd there as the
// sandbox's init (PID 1), as a container does.
package guestinit

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	agentruntime "github.com/agentbox/agentbox/internal/runtime"
)

// Guest-side paths and names shared with the host side (internal/runtime/microvm).
const (
	// InitPath is where the kernel finds envd in the initrd.
	InitPath = "/init"
	// ModulesDir holds the kernel modules in the initrd, loaded in the
	// order listed in ModulesDir/order (dependencies first).
	ModulesDir = "/modules"
	// RootDisk and RWDisk are the serial numbers of the template's
	// read-only root disk and the sandbox's writable disk (the order the
	// kernel names virtio disks in is not the order they are attached in).
	RootDisk = "agentbox-root"
	RWDisk   = "agentbox-rw"
	// ProbeParam on the command line makes the guest print ProbeOK and
	// reset (QEMU then exits): the host's check that this accelerator
	// boots guests.
	ProbeParam = "agentbox.probe"
	ProbeOK    = "agentbox-guest-ok"
	// ConfigFile, at the root of the writable disk (beside the overlay's
	// upper dir, so the sandbox never sees it), holds the guest's Config
	// as JSON.
	ConfigFile = "agentbox-guest.json"

	// GuestFlag tells envd, as the guest's init, to apply the settings
	// frames of a restore (WatchNetwork).
	GuestFlag = "--microvm-guest"

	envdPath = "/.agentbox/bin/envd" // runtime.EnvdPathInSandbox
	logDir   = "/.agentbox/log"
)

// IsGuest reports whether this process is a microVM guest's first process:
// PID 1 started as the initrd's /init (a container's envd runs from
// envdPath).
func IsGuest() bool { return os.Getpid() == 1 && os.Args[0] == InitPath }

// Config is what the host tells the guest.
type Config struct {
	Hostname string   `json:"hostname"`
	Addr     string   `json:"addr"`    // eth0's address, CIDR
	Gateway  string   `json:"gateway"` // default route
	DNS      []string `json:"dns"`     // nameservers
	// UserPIDs and UserMemory are the limits of the user cgroup, where
	// envd starts everything for the user (0: none of its own): the rest
	// of the guest's tasks and RAM are envd's reserve, so the owner can
	// still kill a fork bomb or a memory thrash and run a command.
	UserPIDs   int64 `json:"userPids,omitempty"`
	UserMemory int64 `json:"userMemory,omitempty"`
}

// Run sets the guest up and execs envd as init; it returns only on failure
// (the caller then exits and the kernel panics, which stops the VM).
func Run() error {
	for _, m := range []struct{ src, dst, fstype string }{
		{"devtmpfs", "/dev", "devtmpfs"}, {"proc", "/proc", "proc"}, {"sysfs", "/sys", "sysfs"},
	} {
		_ = os.MkdirAll(m.dst, 0o755)
		if err := unix.Mount(m.src, m.dst, m.fstype, unix.MS_NOSUID, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mount %s: %w", m.dst, err)
		}
	}
	cmdline, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return err
	}
	if slices.Contains(strings.Fields(string(cmdline)), ProbeParam) {
		fmt.Println(ProbeOK)
		return unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART)
	}
	if err := loadModules(ModulesDir); err != nil {
		return err
	}
	if err := mountRoot("/newroot"); err != nil {
		return err
	}
	var cfg Config
	b, err := os.ReadFile(filepath.Join("/rw", ConfigFile))
	if err == nil {
		err = json.Unmarshal(b, &cfg)
	}
	if err != nil {
		return fmt.Errorf("guest config: %w", err)
	}
	if err := writeEtc("/newroot", cfg); err != nil {
		return err
	}
	if err := setupNetwork(cfg); err != nil {
		return fmt.Errorf("network: %w", err)
	}
	if err := switchRoot("/newroot"); err != nil {
		return err
	}
	if err := makeUserCgroup(cgroupRoot, cfg.UserPIDs, cfg.UserMemory); err != nil {
		// A guest without the reserve still serves its owner.
		fmt.Fprintf(os.Stderr, "agentbox guest: no user cgroup: %v\n", err)
	}
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "TERM=xterm"}
	return syscall.Exec(envdPath, []string{envdPath, "--log-file", logDir + "/envd.log", GuestFlag}, env)
}

// loadModules loads dir's modules in the order dir/order lists them.
func loadModules(dir string) error {
	f, err := os.Open(filepath.Join(dir, "order"))
	if err != nil {
		return fmt.Errorf("module list: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name := strings.TrimSpace(sc.Text())
		if name == "" {
			continue
		}
		m, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		err = unix.FinitModule(int(m.Fd()), "", 0)
		m.Close()
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("load module %s: %w", name, err)
		}
	}
	return sc.Err()
}

// findDisk returns the device node of the virtio disk with serial
// number serial, waiting while the kernel is still probing disks.
func findDisk(serial string) (string, error) {
	for range 1000 {
		paths, _ := filepath.Glob("/sys/block/vd*/serial")
		for _, p := range paths {
			if b, err := os.ReadFile(p); err == nil && strings.TrimSpace(string(b)) == serial {
				return "/dev/" + filepath.Base(filepath.Dir(p)), nil
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	return "", fmt.Errorf("disk %s did not appear", serial)
}

// mountRoot mounts the template disk read-only under the writable disk's
// upper directory as an overlay at root, and envd (this binary) on a
// tmpfs at envdPath, where the sandbox cannot change it.
func mountRoot(root string) error {
	rootDev, err := findDisk(RootDisk)
	if err != nil {
		return err
	}
	rwDev, err := findDisk(RWDisk)
	if err != nil {
		return err
	}
	for _, d := range []string{"/lower", "/rw", root} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := unix.Mount(rootDev, "/lower", "ext4", unix.MS_RDONLY, "noload"); err != nil {
		return fmt.Errorf("mount template disk: %w", err)
	}
	if err := unix.Mount(rwDev, "/rw", "ext4", 0, ""); err != nil {
		return fmt.Errorf("mount writable disk: %w", err)
	}
	for _, d := range []string{"/rw/upper", "/rw/work"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := unix.Mount("overlay", root, "overlay", 0, "lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work"); err != nil {
		return fmt.Errorf("mount root overlay: %w", err)
	}
	ab := filepath.Join(root, "/.agentbox")
	if err := os.MkdirAll(ab, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", ab, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=64m"); err != nil {
		return fmt.Errorf("mount %s: %w", ab, err)
	}
	for _, d := range []string{filepath.Dir(envdPath), logDir} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.Chmod(filepath.Join(root, logDir), 0o700); err != nil {
		return err
	}
	if err := copyFile(InitPath, filepath.Join(root, envdPath), 0o755); err != nil {
		return err
	}
	// The bin dir read-only; the log dir below it gets a writable tmpfs of its own.
	if err := unix.Mount("", ab, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("remount %s read-only: %w", ab, err)
	}
	if err := unix.Mount("tmpfs", filepath.Join(root, logDir), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0700,size=16m"); err != nil {
		return fmt.Errorf("mount log dir: %w", err)
	}
	return nil
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// writeEtc gives the sandbox its hostname and resolver, as the container
// tier's bundle does.
func writeEtc(root string, cfg Config) error {
	if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
		return err
	}
	etc := filepath.Join(root, "etc")
	if err := os.MkdirAll(etc, 0o755); err != nil {
		return err
	}
	var resolv strings.Builder
	for _, ns := range cfg.DNS {
		fmt.Fprintf(&resolv, "nameserver %s\n", ns)
	}
	hosts := "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t" + cfg.Hostname + "\n"
	for name, data := range map[string]string{"hostname": cfg.Hostname + "\n", "hosts": hosts, "resolv.conf": resolv.String()} {
		p := filepath.Join(etc, name)
		_ = os.Remove(p) // a template's symlink must not redirect the write
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// setupNetwork brings lo and eth0 up with the address and default route
// the host gave.
func setupNetwork(cfg Config) error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return err
	}
	if cfg.Addr == "" {
		return nil
	}
	var eth netlink.Link
	for range 500 {
		if eth, err = netlink.LinkByName("eth0"); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("eth0: %w", err)
	}
	addr, err := netlink.ParseAddr(cfg.Addr)
	if err != nil {
		return err
	}
	if err := netlink.AddrAdd(eth, addr); err != nil {
		return err
	}
	if err := netlink.LinkSetUp(eth); err != nil {
		return err
	}
	if cfg.Gateway != "" {
		gw := net.ParseIP(cfg.Gateway)
		if gw == nil {
			return fmt.Errorf("agentbox.gw=%q is not an address", cfg.Gateway)
		}
		// On-link: the host may give a /32 address with the gateway
		// outside its prefix.
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: gw, Flags: int(netlink.FLAG_ONLINK)}); err != nil {
			return fmt.Errorf("default route: %w", err)
		}
	}
	return nil
}

// switchRoot moves the kernel filesystems into root and makes it "/".
func switchRoot(root string) error {
	for _, d := range []string{"/dev", "/proc", "/sys"} {
		t := filepath.Join(root, d)
		if err := os.MkdirAll(t, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(d, t, "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("move %s: %w", d, err)
		}
	}
	for _, m := range []struct{ dst, fstype, data string }{
		{"/dev/pts", "devpts", "newinstance,ptmxmode=0666,mode=0620,gid=5"},
		{"/dev/shm", "tmpfs", "mode=1777"},
	} {
		t := filepath.Join(root, m.dst)
		if err := os.MkdirAll(t, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(m.fstype, t, m.fstype, unix.MS_NOSUID|unix.MS_NOEXEC, m.data); err != nil {
			return fmt.Errorf("mount %s: %w", m.dst, err)
		}
	}
	// /dev/ptmx of the devtmpfs belongs to the initial devpts instance.
	ptmx := filepath.Join(root, "/dev/ptmx")
	_ = os.Remove(ptmx)
	if err := os.Symlink("pts/ptmx", ptmx); err != nil {
		return err
	}
	if err := unix.Chdir(root); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move root: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return err
	}
	return unix.Chdir("/")
}

// cgroupRoot is where the guest mounts its cgroup2 hierarchy, where envd
// looks for the user cgroup.
const cgroupRoot = "/sys/fs/cgroup"

// makeUserCgroup mounts the guest's cgroup2 hierarchy at root and makes
// the user cgroup (runtime.UserCgroup) below it with at most pids tasks and
// memBytes of memory; envd, the guest's init, stays in the root cgroup
// outside it. Nothing is made when both limits are 0.
func makeUserCgroup(root string, pids, memBytes int64) error {
	if pids <= 0 && memBytes <= 0 {
		return nil
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("cgroup2", root, "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil && !errors.Is(err, unix.EBUSY) {
		return fmt.Errorf("mount cgroup2: %w", err)
	}
	if err := os.WriteFile(filepath.Join(root, "cgroup.subtree_control"), []byte("+pids +memory"), 0); err != nil {
		return fmt.Errorf("enable the pids and memory controllers: %w", err)
	}
	// The user cgroup is one CPU scheduling entity: thousands of runaway
	// tasks weigh as much as envd, not thousands of times more.
	_ = os.WriteFile(filepath.Join(root, "cgroup.subtree_control"), []byte("+cpu"), 0)
	dir := filepath.Join(root, agentruntime.UserCgroup)
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	for _, f := range []struct {
		name  string
		value int64
	}{{"pids.max", pids}, {"memory.max", memBytes}, {"memory.swap.max", 0}} {
		if f.value <= 0 && f.name != "memory.swap.max" {
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, f.name), []byte(fmt.Sprint(f.value)), 0); err != nil && f.name != "memory.swap.max" {
			return fmt.Errorf("%s: %w", f.name, err)
		}
	}
	return nil
}
