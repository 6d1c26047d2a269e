package runc

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/bundle"
)

// Every boot of a sandbox has its own boot id: the kernel's
// /proc/sys/kernel/random/boot_id is the host's, the same in every
// container, so it would both tie sandboxes together and name the host.
// The bundle holds the boot's id in a file, which is mounted read-only over
// the kernel's between `runc create` and the init's start: runc 1.1 refuses
// spec mounts under /proc/sys, and envd's seccomp filter refuses mount(2)
// (and umount(2): the sandbox cannot take it off). A CRIU dump records the
// mount as external and a restore mounts the bundle's file again, so a
// memory restore keeps the id, as a VM's kernel would.
const (
	// BootIDHook names the hook that mounts the file in the sandbox.
	BootIDHook = "boot-id"
	// bootIDFile is the boot id's file in the bundle.
	bootIDFile = "boot_id"
	// bootIDInSandbox is the kernel's file, from the sandbox's root.
	bootIDInSandbox = "/proc/sys/kernel/random/boot_id"
	// bootIDKey names the mount in CRIU images.
	bootIDKey = "agentbox-boot-id"
)

// writeBootID writes the boot id of the bundle in dir's next boot: id, or
// a new random one when id is "". Everyone may read it (it is what the
// sandbox's processes read); only root writes it, and the bundle directory
// keeps other host users away.
func writeBootID(dir, id string) error {
	if id == "" {
		id = runtime.NewBootID()
	}
	// The bundle's file is the one that lasts; the sandbox's is bound from
	// the view's copy (bundle.ViewFile), where it names no host path.
	for _, p := range []string{filepath.Join(dir, bootIDFile), bundle.ViewFile(dir, bootIDFile)} {
		_ = os.Remove(p) // a mounted file's inode stays with its old mount
		if err := os.WriteFile(p, []byte(id+"\n"), 0o444); err != nil {
			return fmt.Errorf("boot id: %w", err)
		}
	}
	return nil
}

// hasBootID reports whether the bundle in dir has a boot id file (bundles
// of older servers have none, and no mount to carry through CRIU).
func hasBootID(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, bootIDFile))
	return err == nil
}

// bootIDConf are the CRIU options that carry the mount through a dump
// (where) and a restore (from which file).
func bootIDDumpConf() string { return "external mnt[" + bootIDInSandbox + "]:" + bootIDKey }
func bootIDRestoreConf(dir string) string {
	return "external mnt[" + bootIDKey + "]:" + bundle.ViewFile(dir, bootIDFile)
}

// mountBootID mounts the bundle's boot id file over the kernel's in the
// created (not yet started) sandbox whose init is pid. The mount is made
// here, detached and read-only, and attached by the boot-id hook from
// inside the sandbox's mount namespace, which only a single-threaded
// process can join. With limitNS the same exec first sets the inotify caps
// of the sandbox's user namespace (limitUserNS without a second exec).
func (d *Driver) mountBootID(ctx context.Context, dir string, pid int, limitNS bool) error {
	if d.b.HookBinary() == "" {
		return fmt.Errorf("mount the sandbox's boot id: no hook binary configured: %w", errdefs.ErrUnavailable)
	}
	tree, err := unix.OpenTree(unix.AT_FDCWD, bundle.ViewFile(dir, bootIDFile), unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("mount the sandbox's boot id: %w", err)
	}
	f := os.NewFile(uintptr(tree), "boot-id-mount")
	defer f.Close()
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOEXEC}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, attr); err != nil {
		return fmt.Errorf("mount the sandbox's boot id read-only: %w", err)
	}
	args := []string{BootIDHook, "--pid", strconv.Itoa(pid)}
	if limitNS {
		args = append(args, "--inotify-instances", strconv.Itoa(sandboxInotifyInstances), "--inotify-watches", strconv.Itoa(sandboxInotifyWatches))
	}
	argv := d.b.HookArgv(args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.ExtraFiles = []*os.File{f} // fd 3
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("mount the sandbox's boot id: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// RunBootIDHook is the Go side of `agentbox __hook boot-id --pid <pid>
// [--inotify-instances <n> --inotify-watches <n>]`, whose work is done by
// internal/runtime/nsjoin's constructor before the Go runtime starts: in
// the mount namespace of --pid it attaches the detached mount it got as fd
// 3 over the kernel's boot_id, resolved without following symlinks and
// only on procfs, so files of the sandbox's own making are never mounted
// over; with the inotify flags it also sets those caps in --pid's user
// namespace. This is reached only when the constructor left the call
// alone (joined and limited say what it did), and names why.
func RunBootIDHook(args []string, joined, limited bool) error {
	fs := flag.NewFlagSet(BootIDHook, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	pid := fs.Int("pid", 0, "")
	instances := fs.Int("inotify-instances", 0, "")
	watches := fs.Int("inotify-watches", 0, "")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%s hook: %w", BootIDHook, err)
	}
	if fs.NArg() > 0 || *pid <= 0 {
		return fmt.Errorf("%s hook: want --pid <positive pid> and nothing else, got %q", BootIDHook, args)
	}
	if !joined {
		return fmt.Errorf("%s hook: not in the mount namespace of pid %d (the binary lacks internal/runtime/nsjoin, or was built without cgo): %w", BootIDHook, *pid, errdefs.ErrUnavailable)
	}
	if *instances != 0 || *watches != 0 {
		if *instances <= 0 || *watches <= 0 {
			return fmt.Errorf("%s hook: --inotify-instances and --inotify-watches: want both, positive, got %d and %d", BootIDHook, *instances, *watches)
		}
		if !limited {
			return fmt.Errorf("%s hook: the inotify caps of pid %d's user namespace were not set (the binary lacks internal/runtime/nsjoin): %w", BootIDHook, *pid, errdefs.ErrUnavailable)
		}
	}
	return notRun(BootIDHook, args)
}
