// Package microvm is the microVM tier's driver: each sandbox is a QEMU
// "microvm" machine with a guest kernel of its own. The guest boots
// Debian's kernel directly (no firmware) with envd as the initrd's init
// (internal/guestinit), the template's layers as a read-only ext4 disk under
// a per-sandbox writable disk, and its NIC bridged into the sandbox's netns
// so the guest has the sandbox's address and the host-side network policy
// applies unchanged. QEMU uses KVM where it boots guests, else TCG (software
// emulation: slow, but a real separate kernel).
package microvm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/guestinit"
	"github.com/agentbox/agentbox/internal/hostkey"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/bundle"
)

// Name is the tier this driver runs (Spec.Runtime).
const Name = "microvm"

// DefaultKernelDir is where scripts/install-deps.sh puts guest kernels.
const DefaultKernelDir = "/var/cache/agentbox/microvm"

// InstallHint tells an operator how to get the microVM tier.
const InstallHint = "install QEMU and a guest kernel (scripts/install-deps.sh does: apt-get install qemu-system-x86 lz4, then unpacks linux-image-cloud-amd64's vmlinux and virtio modules into " + DefaultKernelDir + "/<version>/) and restart the server"

// Defaults for a sandbox without limits: the guest needs some memory of its own.
const (
	defaultMemoryMB = 512
	minMemoryMB     = 128
	defaultDiskMB   = 2048
	// qemuOverheadMB is what QEMU itself may use beyond guest RAM (the TCG
	// translation cache is capped at tcgCacheMB of it).
	qemuOverheadMB = 256
	tcgCacheMB     = 64
)

// Config configures the driver.
type Config struct {
	// StateDir holds one directory per sandbox. Required.
	StateDir string
	// RunDir holds the initrds built at first use. Required.
	RunDir string
	// Envd is the static envd binary, the guest's init. Required.
	Envd string
	// KernelDir holds guest kernels. Default DefaultKernelDir.
	KernelDir string
	// CacheDir holds the templates' root images. Default KernelDir/roots' parent.
	CacheDir string
	// QEMU is the emulator. Default qemu-system-x86_64 from PATH.
	QEMU string
	// Accel is "kvm", "tcg" or "" (auto: KVM when it boots a guest here, else TCG).
	Accel string
	// CgroupParent is the cgroup the QEMU processes go under.
	CgroupParent string
	// Net makes each sandbox's netns.
	Net runtime.NetPlugger
	// HookBinary is the agentbox binary, which confines the host tools
	// that edit a guest's disk (internal/confine). Required to start
	// sandboxes from file-system snapshots.
	HookBinary string
}

// Driver runs microVM sandboxes. Its state is on disk (a directory per
// sandbox with QEMU's pid file), so it survives server restarts.
type Driver struct {
	cfg  Config
	log  *slog.Logger
	keys hostkey.Keyer
	// cgroupV2 is whether the host has the unified hierarchy only.
	cgroupV2 bool

	once   sync.Once
	probed probe
}

// probe is the result of checking what this host can boot.
type probe struct {
	err    error // why the tier cannot run here
	accel  string
	kernel Kernel
	initrd string
	qemu   string
}

var (
	_ runtime.Runtime = (*Driver)(nil)
)

// New checks cfg; what the host can run is probed at first use.
func New(cfg Config, log *slog.Logger) (*Driver, error) {
	if cfg.StateDir == "" || cfg.RunDir == "" || cfg.Envd == "" {
		return nil, fmt.Errorf("microvm: StateDir, RunDir and Envd are required: %w", errdefs.ErrInvalidArgument)
	}
	if cfg.KernelDir == "" {
		cfg.KernelDir = DefaultKernelDir
	}
	if cfg.CacheDir == "" {
		cfg.CacheDir = cfg.KernelDir
	}
	if cfg.QEMU == "" {
		cfg.QEMU = "qemu-system-x86_64"
	}
	if log == nil {
		log = slog.Default()
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, err
	}
	keys, err := hostkey.Load(filepath.Join(cfg.StateDir, ".hostkey"))
	if err != nil {
		return nil, err
	}
	return &Driver{cfg: cfg, log: log.With("component", Name), keys: keys, cgroupV2: bundle.IsCgroupV2()}, nil
}

// Tier is the driver's entry in the tier registry.
func (d *Driver) Tier() runtime.Tier {
	return runtime.Tier{Name: Name, Driver: d, Available: d.available, Owns: func(id string) bool {
		_, err := os.Stat(d.dir(id))
		return bundle.CheckID(id) == nil && err == nil
	}}
}

// Accelerator reports the accelerator sandboxes run with ("kvm" or "tcg"),
// or why none works.
func (d *Driver) Accelerator() (string, error) {
	p := d.probe()
	return p.accel, p.err
}

func (d *Driver) available() error { return d.probe().err }

// probe finds QEMU and the kernel, builds the initrd and boots it once
// per accelerator until one reaches the guest's init.
func (d *Driver) probe() probe {
	d.once.Do(func() {
		d.probed = d.doProbe()
		if d.probed.err != nil {
			d.log.Warn("microvm tier unavailable", "err", d.probed.err)
		} else {
			d.log.Info("microvm tier available", "accel", d.probed.accel, "kernel", d.probed.kernel.Version)
		}
	})
	return d.probed
}

func (d *Driver) doProbe() (p probe) {
	unavailable := func(format string, a ...any) probe {
		return probe{err: fmt.Errorf("the microvm tier cannot run on this server: "+format+": %s: %w", append(a, InstallHint, errdefs.ErrUnavailable)...)}
	}
	q, err := exec.LookPath(d.cfg.QEMU)
	if err != nil {
		return unavailable("%s is not installed", d.cfg.QEMU)
	}
	k, err := findKernel(d.cfg.KernelDir)
	if err != nil {
		return unavailable("%v", err)
	}
	if err := os.MkdirAll(d.cfg.RunDir, 0o700); err != nil {
		return probe{err: err}
	}
	initrd, err := buildInitrd(d.cfg.RunDir, k, d.cfg.Envd)
	if err != nil {
		return probe{err: fmt.Errorf("microvm initrd: %w", err)}
	}
	p = probe{kernel: k, initrd: initrd, qemu: q}
	accels := []string{"kvm", "tcg"}
	if d.cfg.Accel != "" {
		accels = []string{d.cfg.Accel}
	}
	// The boot that picked the accelerator is remembered for this host
	// boot, kernel and QEMU: every server start (and every test server)
	// would otherwise pay for it again, up to the KVM probe's timeout.
	cache := probeCachePath(k, q)
	if b, err := os.ReadFile(cache); err == nil && d.cfg.Accel == "" && (string(b) == "kvm" || string(b) == "tcg") {
		p.accel = string(b)
		return p
	}
	var why []string
	for _, a := range accels {
		if a == "kvm" {
			if f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0); err != nil {
				why = append(why, "kvm: /dev/kvm: "+err.Error())
				continue
			} else {
				f.Close()
			}
		}
		if err := d.bootProbe(p, a); err != nil {
			why = append(why, a+": "+err.Error())
			continue
		}
		p.accel = a
		if d.cfg.Accel == "" && cache != "" {
			_ = os.WriteFile(cache, []byte(a), 0o600)
		}
		return p
	}
	return unavailable("no accelerator boots a guest (%s)", strings.Join(why, "; "))
}

// probeCachePath is where the accelerator picked for kernel k and QEMU
// binary qemu is remembered until the host reboots ("" if it cannot be).
func probeCachePath(k Kernel, qemu string) string {
	bootID, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	fi, serr := os.Stat(qemu)
	if err != nil || serr != nil {
		return ""
	}
	return filepath.Join(filepath.Dir(k.Vmlinux), fmt.Sprintf("accel-%s-%d", strings.TrimSpace(string(bootID)), fi.ModTime().Unix()))
}

// bootProbe boots the guest kernel under accel until its init answers.
func (d *Driver) bootProbe(p probe, accel string) error {
	// A working KVM boots in about a second; nested KVM that hangs should
	// not hold the server up long. TCG needs a few seconds, more on a busy host.
	timeout := 60 * time.Second
	if accel == "kvm" {
		timeout = 15 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return bootGuest(ctx, p, accel)
}

// RawBoot boots the installed guest kernel with initrd (an initrd the
// server built: its runtime dir's microvm/initrd-*.cpio) under accel until
// the guest's init runs, and returns how long that took: the floor of a
// microVM sandbox's start, for the bench.
func RawBoot(ctx context.Context, accel, initrd string) (time.Duration, error) {
	k, err := findKernel(DefaultKernelDir)
	if err != nil {
		return 0, err
	}
	q, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		return 0, err
	}
	start := time.Now()
	if err := bootGuest(ctx, probe{kernel: k, initrd: initrd, qemu: q}, accel); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// bootGuest boots a guest without devices that prints ProbeOK from its
// init and resets, which ends QEMU.
func bootGuest(ctx context.Context, p probe, accel string) error {
	args := machineArgs(p, accel, 1, 256, []string{guestinit.ProbeParam})
	cmd := exec.CommandContext(ctx, p.qemu, append(args, "-serial", "stdio")...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if bytes.Contains(out.Bytes(), []byte(guestinit.ProbeOK)) {
		return nil
	}
	if ctx.Err() != nil {
		return fmt.Errorf("the guest did not boot in time (%w): a hang (nested KVM) or a host too busy", ctx.Err())
	}
	tail := out.Bytes()
	if len(tail) > 300 {
		tail = tail[len(tail)-300:]
	}
	return fmt.Errorf("the guest did not boot (%v): %s", err, bytes.TrimSpace(tail))
}

// machineArgs is QEMU's command line for a guest without devices.
func machineArgs(p probe, accel string, cpus, memMB int, params []string) []string {
	cpu, acc := "max", "tcg,tb-size="+strconv.Itoa(tcgCacheMB)
	if accel == "kvm" {
		cpu, acc = "host", "kvm"
	}
	// The TSC parameters keep the guest from stalling while it
	// calibrates its clock against an emulated PIT (seen under TCG).
	cmdline := append([]string{"console=ttyS0", "quiet", "panic=-1", "reboot=t",
		"tsc_early_khz=2000000", "tsc=reliable", "no_timer_check", "lpj=4000000"}, params...)
	return []string{
		"-M", "microvm,x-option-roms=off,isa-serial=on,rtc=on,pit=on",
		"-accel", acc, "-cpu", cpu, "-smp", strconv.Itoa(cpus), "-m", strconv.Itoa(memMB),
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		"-kernel", p.kernel.Vmlinux, "-initrd", p.initrd, "-append", strings.Join(cmdline, " "),
		// QEMU itself may not spawn processes or call obsolete syscalls.
		// Privilege changes stay allowed: the filter is in place before
		// -runas drops to the sandbox's uid, after which there is none to gain.
		"-sandbox", "on,obsolete=deny,elevateprivileges=allow,spawn=deny,resourcecontrol=deny",
	}
}

// dir is sandbox id's state directory, named by its host key (QEMU's
// command line, which every host user can read, names it).
func (d *Driver) dir(id string) string { return filepath.Join(d.cfg.StateDir, d.keys.Key(id)) }

// Files in a sandbox's state directory.
const (
	idFile   = "id"
	pidFile  = "qemu.pid"
	diskFile = "disk.ext4"
	seedDir  = "seed"
	qmpSock  = "qmp.sock"
	qemuLog  = "qemu.log"
	specFile = "spec.json"
)

// Create boots the sandbox's VM and returns once QEMU runs (the manager
// waits for envd to answer).
func (d *Driver) Create(ctx context.Context, spec runtime.Spec) (err error) {
	if err := bundle.CheckID(spec.ID); err != nil {
		return err
	}
	p := d.probe()
	if p.err != nil {
		return fmt.Errorf("sandbox %s: %w", spec.ID, p.err)
	}
	dir, err := d.makeStateDir(spec)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = d.Delete(context.WithoutCancel(ctx), spec.ID)
		}
	}()
	root, err := d.rootImage(ctx, spec.ID, spec.Layers)
	if err != nil {
		return fmt.Errorf("sandbox %s: root image: %w", spec.ID, err)
	}
	if d.cfg.Net != nil {
		if err := d.cfg.Net.Plug(ctx, spec.ID, 0); err != nil {
			return err
		}
	}
	mac, _, addr, gw, err := guestNet(spec.NetNSPath)
	if err != nil {
		return fmt.Errorf("sandbox %s: network: %w", spec.ID, err)
	}
	// The guest's settings ride on its writable disk (outside the
	// overlay's upper dir, so the sandbox does not see them), not on the
	// kernel command line every host user can read.
	seed := filepath.Join(dir, seedDir)
	if err := os.Mkdir(seed, 0o700); err != nil {
		return err
	}
	gc, _ := json.Marshal(guestConfig(spec, addr, gw))
	if err := os.WriteFile(filepath.Join(seed, guestinit.ConfigFile), gc, 0o600); err != nil {
		return err
	}
	diskMB := int64(spec.Resources.DiskMB)
	if diskMB <= 0 {
		diskMB = defaultDiskMB
	}
	if err := mkfs(ctx, filepath.Join(dir, diskFile), diskMB, seed); err != nil {
		return err
	}
	return d.start(ctx, spec, p, root, mac, nil)
}

// memoryMB is the guest's RAM for spec.
func memoryMB(spec runtime.Spec) int {
	mb := spec.Resources.MemoryMB
	if mb <= 0 {
		mb = defaultMemoryMB
	}
	return max(mb, minMemoryMB)
}

// start runs QEMU for spec in its netns (daemonized: it outlives the
// server) with extra arguments (an incoming migration) and files it
// inherits as descriptors 3, 4, ..., then wires its tap.
func (d *Driver) start(ctx context.Context, spec runtime.Spec, p probe, root, mac string, extra []string, files ...*os.File) error {
	dir := d.dir(spec.ID)
	uid, err := d.sandboxUID(spec.ID)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	// The disks come as descriptors in fd sets (after the caller's
	// files): QEMU reopens a disk read-only while it saves the VM, which
	// by path it could not once it runs as the sandbox's uid.
	disks, err := openDisks(root, filepath.Join(dir, diskFile))
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	defer func() {
		for _, f := range disks {
			f.Close()
		}
	}()
	empty, err := d.emptyRoot()
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	fd := 3 + len(files)
	files = append(files, disks...)
	cpus := max(spec.Resources.CPUCount, 1)
	args := machineArgs(p, p.accel, cpus, memoryMB(spec), nil)
	args = append(args,
		"-name", d.keys.Key(spec.ID),
		"-add-fd", fmt.Sprintf("fd=%d,set=1", fd),
		"-add-fd", fmt.Sprintf("fd=%d,set=2", fd+1), "-add-fd", fmt.Sprintf("fd=%d,set=2", fd+2),
		"-drive", "id=root,file=/dev/fdset/1,format=raw,if=none,readonly=on",
		"-device", "virtio-blk-device,drive=root,serial="+guestinit.RootDisk,
		// No image locks: the disk is this QEMU's alone, and its own
		// read-only descriptor (held since a migration out) would stop
		// the writable one from relocking when a snapshot's source runs on.
		"-drive", "id=rw,file=/dev/fdset/2,format=raw,if=none,discard=unmap,file.locking=off",
		"-device", "virtio-blk-device,drive=rw,serial="+guestinit.RWDisk,
		"-netdev", "tap,id=net0,ifname="+tapName+",script=no,downscript=no",
		"-device", "virtio-net-device,netdev=net0,mac="+mac,
		// The console goes to a ring buffer in QEMU's memory: the guest's
		// root can write to it without end, which a file would let fill
		// the host's disk.
		"-chardev", "ringbuf,id=console,size=65536", "-serial", "chardev:console",
		"-qmp", "unix:"+filepath.Join(dir, qmpSock)+",server=on,wait=off",
		"-pidfile", filepath.Join(dir, pidFile),
		"-runas", fmt.Sprintf("%d:%d", uid, uid),
		// Once the kernel, initrd, disks, tap and monitor are open, QEMU
		// leaves the host's filesystem for an empty root: an escape from
		// the device model finds no file every host user may read.
		"-chroot", empty,
	)
	args = append(args, extra...)
	// Not -daemonize: QEMU's sandbox forbids the fork it needs. QEMU runs
	// in a session of its own, outlives the server, and is reaped by
	// whichever process (server or init) is its parent.
	// Its output goes to a file: a pipe to the server would break when
	// the server exits.
	logPath := filepath.Join(dir, qemuLog)
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	var qemu *exec.Cmd
	if err := runInNetNS(spec.NetNSPath, func() error {
		qemu = exec.Command(p.qemu, args...)
		qemu.SysProcAttr = &unix.SysProcAttr{Setsid: true}
		qemu.Stdout, qemu.Stderr = logf, logf
		qemu.ExtraFiles = files
		return qemu.Start()
	}); err != nil {
		return fmt.Errorf("sandbox %s: qemu: %w", spec.ID, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- qemu.Wait() }()
	if err := d.waitQMP(ctx, spec.ID, exited); err != nil {
		_ = qemu.Process.Kill()
		return fmt.Errorf("sandbox %s: qemu: %w: %s", spec.ID, err, fileTail(logPath))
	}
	pid, err := d.pid(spec.ID)
	if err != nil {
		return fmt.Errorf("sandbox %s: qemu did not start: %w", spec.ID, err)
	}
	if err := d.limit(spec, pid); err != nil {
		return fmt.Errorf("sandbox %s: limits: %w", spec.ID, err)
	}
	if err := wireTap(spec.NetNSPath); err != nil {
		return fmt.Errorf("sandbox %s: network: %w", spec.ID, err)
	}
	d.log.Debug("microvm started", "id", spec.ID, "pid", pid, "accel", p.accel)
	return nil
}

// openDisks opens the template image read-only and the writable disk
// read-write and read-only, in the order of start's fd sets.
func openDisks(root, disk string) ([]*os.File, error) {
	var files []*os.File
	for _, o := range []struct {
		path string
		flag int
	}{{root, os.O_RDONLY}, {disk, os.O_RDWR}, {disk, os.O_RDONLY}} {
		f, err := os.OpenFile(o.path, o.flag|unix.O_CLOEXEC, 0)
		if err != nil {
			for _, f := range files {
				f.Close()
			}
			return nil, err
		}
		files = append(files, f)
	}
	return files, nil
}

// waitQMP waits until QEMU answers on its monitor (it is initialised) or exits.
func (d *Driver) waitQMP(ctx context.Context, id string, exited <-chan error) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		select {
		case err := <-exited:
			return fmt.Errorf("exited: %v", err)
		case <-ctx.Done():
			return fmt.Errorf("no monitor within 30s: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
		if q, err := d.dialQMP(ctx, id); err == nil {
			q.Close()
			return nil
		}
	}
}

// fileTail returns the end of a log file, for an error message.
func fileTail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 500 {
		b = b[len(b)-500:]
	}
	return string(bytes.TrimSpace(b))
}

// runInNetNS runs f on a thread in the netns at path; processes f starts
// are born there. The thread is not reused afterwards.
func runInNetNS(path string, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		goruntime.LockOSThread()
		// No UnlockOSThread: the thread ends with the goroutine.
		ns, err := netns.GetFromPath(path)
		if err != nil {
			errc <- fmt.Errorf("netns %s: %w", path, err)
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			errc <- fmt.Errorf("enter netns: %w", err)
			return
		}
		errc <- f()
	}()
	return <-errc
}

// pid returns the pid of sandbox id's QEMU, or an error if it is not running.
func (d *Driver) pid(id string) (int, error) {
	b, err := os.ReadFile(filepath.Join(d.dir(id), pidFile))
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("pid file: %q", b)
	}
	// A recycled pid is someone else's: QEMU's command line names the dir.
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || !bytes.Contains(cmdline, []byte(d.dir(id)+"/")) {
		return 0, fmt.Errorf("qemu %d is not running: %w", pid, os.ErrNotExist)
	}
	return pid, nil
}

// kill stops sandbox id's QEMU; one that does not run is not an error.
func (d *Driver) kill(ctx context.Context, id string) error {
	pid, err := d.pid(id)
	if err != nil {
		return nil
	}
	return bundle.KillWait(ctx, id, pid)
}

// Delete stops the VM and removes its state. Unknown ids are not an error.
func (d *Driver) Delete(ctx context.Context, id string) error {
	if err := bundle.CheckID(id); err != nil {
		return err
	}
	if err := d.kill(ctx, id); err != nil {
		return err
	}
	d.removeCgroups(id)
	d.releaseUID(id)
	if err := os.RemoveAll(d.dir(id)); err != nil {
		return fmt.Errorf("sandbox %s: remove state: %w", id, err)
	}
	return nil
}

// State reports running while QEMU runs, stopped while only the state
// directory is left (a paused sandbox), else errdefs.ErrNotFound.
func (d *Driver) State(ctx context.Context, id string) (runtime.Status, error) {
	if err := bundle.CheckID(id); err != nil {
		return "", err
	}
	if _, err := os.Stat(d.dir(id)); err != nil {
		return "", fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	if _, err := d.pid(id); err != nil {
		return runtime.StatusStopped, nil
	}
	if st, err := d.qmpStatus(ctx, id); err == nil && st == "paused" {
		return runtime.StatusPaused, nil
	}
	return runtime.StatusRunning, nil
}

// Stats reads QEMU's cgroup and the writable disk's allocated size.
func (d *Driver) Stats(ctx context.Context, id string) (runtime.Stats, error) {
	if _, err := d.State(ctx, id); err != nil {
		return runtime.Stats{}, err
	}
	st := runtime.Stats{Timestamp: time.Now()}
	d.cgroupStats(id, &st)
	var s unix.Stat_t
	if err := unix.Stat(filepath.Join(d.dir(id), diskFile), &s); err == nil {
		st.DiskUsed, st.DiskTotal = uint64(s.Blocks)*512, uint64(s.Size)
	}
	return st, nil
}

// List returns the ids of every sandbox with a state directory.
func (d *Driver) List(ctx context.Context) ([]string, error) {
	entries, err := os.ReadDir(d.cfg.StateDir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	var ids []string
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(d.cfg.StateDir, e.Name(), idFile))
		if err != nil || bundle.CheckID(string(b)) != nil || d.keys.Key(string(b)) != e.Name() {
			continue
		}
		ids = append(ids, string(b))
	}
	slices.Sort(ids)
	return ids, nil
}

// emptyRoot is the empty, root-owned directory QEMU chroots into.
func (d *Driver) emptyRoot() (string, error) {
	dir := filepath.Join(d.cfg.RunDir, "empty")
	if err := os.Mkdir(dir, 0o555); err != nil && !errors.Is(err, os.ErrExist) {
		return "", err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	if len(entries) != 0 {
		return "", fmt.Errorf("%s: QEMU's root must be empty", dir)
	}
	return dir, os.Chmod(dir, 0o555)
}

// makeStateDir makes the state dir of sandbox spec.ID (private to the
// server) with its id and spec files; a dir that exists is a conflict. On
// a later failure the caller removes it with Delete.
func (d *Driver) makeStateDir(spec runtime.Spec) (string, error) {
	dir := d.dir(spec.ID)
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return "", fmt.Errorf("sandbox %s: %w", spec.ID, errdefs.ErrConflict)
		}
		return "", err
	}
	b, _ := json.Marshal(spec)
	if err := errors.Join(os.WriteFile(filepath.Join(dir, idFile), []byte(spec.ID), 0o600),
		os.WriteFile(filepath.Join(dir, specFile), b, 0o600)); err != nil {
		_ = os.RemoveAll(dir)
		return "", err
	}
	return dir, nil
}
