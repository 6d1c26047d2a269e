package runc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	gorunc "github.com/containerd/go-runc"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/bundle"
	"github.com/agentbox/agentbox/internal/runtime/ocicli"
)

// Files of a CRIU checkpoint in the bundle (bundle/image.go has the rest).
const (
	// criuConf is the sandbox's own CRIU configuration, rewritten before
	// every dump and restore with that operation's options (runc 1.1 has
	// no flags for them; see setCRIUConf).
	criuConf = "criu.conf"
	// criuInventory is the first file of a CRIU image.
	criuInventory = "inventory.img"
	// criuStatsDump is the last file CRIU writes into a complete dump image.
	criuStatsDump = "stats-dump"
)

// DefaultCRIUPath is where scripts/install-deps.sh installs a CRIU new
// enough for this kernel (>= 4.2: older ones cannot dump TCP sockets on
// kernels >= 6.16), beside the distribution's own.
const DefaultCRIUPath = "/usr/local/libexec/agentbox/criu"

// criuFinder finds the CRIU binary once: DefaultCRIUPath, then criu from PATH.
type criuFinder struct {
	once sync.Once
	path string
	err  error
}

var errNoCRIU = errors.New("no CRIU >= 4.2 found (install it with scripts/install-deps.sh)")

func (d *Driver) criu() (string, error) {
	d.criuOnce.once.Do(func() {
		for _, p := range []string{d.cfg.CRIUPath, DefaultCRIUPath, "criu"} {
			if p == "" {
				continue
			}
			bin, err := exec.LookPath(p)
			if err != nil {
				continue
			}
			out, err := exec.Command(bin, "--version").Output()
			if err != nil {
				continue
			}
			if criuVersionOK(string(out)) {
				d.criuOnce.path = bin
				return
			}
			d.log.Warn("CRIU too old for checkpoints on this kernel; need >= 4.2", "criu", bin, "version", strings.TrimSpace(string(out)))
		}
		d.criuOnce.err = fmt.Errorf("%w: %w", errNoCRIU, errdefs.ErrUnavailable)
	})
	if d.criuOnce.err == nil {
		d.kdat.ensure(context.Background(), d.criuOnce.path, d.log) // kdat.go
	}
	return d.criuOnce.path, d.criuOnce.err
}

// criuVersionOK parses `criu --version` ("Version: 4.2.1") and wants >= 4.2.
func criuVersionOK(out string) bool {
	for line := range strings.SplitSeq(out, "\n") {
		v, ok := strings.CutPrefix(strings.TrimSpace(line), "Version:")
		if !ok {
			continue
		}
		var major, minor int
		if _, err := fmt.Sscanf(strings.TrimSpace(v), "%d.%d", &major, &minor); err != nil {
			return false
		}
		return major > 4 || major == 4 && minor >= 2
	}
	return false
}

// CheckpointSupported reports whether this host can checkpoint sandboxes.
func (d *Driver) CheckpointSupported() error {
	_, err := d.criu()
	return err
}

// criuClient is a go-runc client for a command that drives CRIU. go-runc
// no longer passes a CRIU binary (its Criu field is deprecated: runc >= 1.2
// ignores --criu), but Debian's runc 1.1 honours the global flag, and it
// must run our CRIU >= 4.2 rather than whichever is first in PATH.
func (d *Driver) criuClient(logFile string) (*gorunc.Runc, error) {
	criu, err := d.criu()
	if err != nil {
		return nil, err
	}
	c := d.client(logFile)
	c.ExtraArgs = []string{"--criu", criu}
	return c, nil
}

// DefaultFreezeTimeout is Config.FreezeTimeout's default.
const DefaultFreezeTimeout = 30 * time.Second

// freezeTimeoutConf is the CRIU configuration line of timeout t, rounded up
// to whole seconds. CRIU applies its configuration file over runc's RPC
// options, which set no timeout.
func freezeTimeoutConf(t time.Duration) string {
	return "timeout " + strconv.Itoa(int((t+time.Second-1)/time.Second))
}

// freezeTimedOut reports whether the failed dump whose CRIU work dir is
// work gave up freezing the sandbox's cgroup.
func freezeTimedOut(work string) bool {
	b, err := os.ReadFile(filepath.Join(work, "dump.log"))
	return err == nil && bytes.Contains(b, []byte("Unable to freeze cgroup"))
}

// criuFailed wraps a failed checkpoint or restore with runc's reason and
// the first error of CRIU's own log in work, where the real cause is.
func (d *Driver) criuFailed(verb, logFile, work string, err error) error {
	name := "dump.log"
	if verb == "restore" {
		name = "restore.log"
	}
	return fmt.Errorf("%w%s", d.Failed(verb, logFile, err), logHint(filepath.Join(work, name)))
}

// CRIU locks a dumped netns's traffic until the restore has its sockets
// back. Its default method runs iptables-restore, twice (IPv4 and IPv6), at
// the lock and again at the unlock, each a process start on the critical
// path of a pause, a resume and every fork; the nftables method does the
// same in CRIU's own process through libnftables. Images dumped with it say
// so (nftLockMarker): the unlock must use the method of the lock, so older
// images keep the iptables one.
const (
	nftLockConf   = "network-lock nftables"
	nftLockMarker = "agentbox-nft-lock"
)

// criuRestoreLog is CRIU's log of the sandbox's last restore, in its bundle;
// criuLazyFailedLog that of its last lazy restore that failed.
const (
	// restoreWorkDir is CRIU's work dir of a restore, in the bundle.
	restoreWorkDir    = "criu-restore-work"
	criuRestoreLog    = "criu-restore.log"
	criuLazyFailedLog = "criu-restore-lazy-failed.log"
)

// Checkpoint dumps the sandbox with CRIU. Established TCP connections (the
// gateway's, a client's) are dumped too, so they continue after a resume.
func (d *Driver) Checkpoint(ctx context.Context, id string, opts runtime.CheckpointOptions) (err error) {
	dir, err := d.BundleOf(id)
	if err != nil {
		return err
	}
	// A lazy resume still loading memory finishes first: the dump reads
	// every page, and the new image must not be removed as the old one.
	if err := d.waitLazy(ctx, id); err != nil {
		return fmt.Errorf("sandbox %s: waiting for its memory to load after a resume: %w", id, err)
	}
	if opts.FilesystemOnly {
		return d.b.FSCheckpoint(ctx, id, opts, d)
	}
	ns, err := bundle.ReadNS(dir)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	if err := checkpointUserNS(id, ns); err != nil {
		return err
	}
	logFile := filepath.Join(dir, "runc-checkpoint.log")
	rc, err := d.criuClient(logFile)
	if err != nil {
		return err
	}
	img, own, drop, err := d.DumpImage(id, opts)
	if err != nil {
		return err
	}
	defer drop(&err)
	work := filepath.Join(dir, bundle.CRIUWorkDir)
	_ = os.RemoveAll(work)
	if err := os.MkdirAll(work, 0o700); err != nil {
		return err
	}

	// The writable layer must be copied while the processes are stopped:
	// CRIU checks every open file against the image at restore, and a later
	// copy would silently disagree with memory (appended logs). Freezing
	// first makes dump + copy one consistent instant; CRIU leaves a frozen
	// cgroup frozen.
	frozen, err := d.FreezeForDump(ctx, id, opts)
	if err != nil {
		return err
	}
	defer frozen.Thaw(&err)
	quickState := ""
	if !opts.LeaveRunning && opts.UpperCopy == "" {
		// Frozen here, CRIU does not wait for the freezer in steps of
		// 100 ms (freezefast.go); a failed dump leaves the cgroup
		// frozen as CRIU found it, and the sandbox keeps running.
		if st := d.freezerStateFile(id); quickFreeze(ctx, st, quickFreezeWait) {
			quickState = st
			defer func() {
				if err != nil {
					thawFile(st)
				}
			}()
		}
	}
	// Connections the sandbox's servers have not accepted yet (a client
	// connecting at this instant) cannot be dumped; CRIU would fail the
	// whole pause on them. They are left out: their clients see a reset,
	// as if the server had been restarted.
	conf := []string{"skip-in-flight", freezeTimeoutConf(d.cfg.FreezeTimeout), nftLockConf}
	if hasBootID(dir) {
		conf = append(conf, bootIDDumpConf())
	}
	if err := writeCRIUConf(dir, conf); err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	var actions []gorunc.CheckpointAction
	if opts.LeaveRunning {
		actions = append(actions, gorunc.LeaveRunning)
	}
	copts := &gorunc.CheckpointOpts{ImagePath: img, WorkDir: work, AllowOpenTCP: true, FileLocks: true}
	// A busy host can keep the freezer from catching every task in time;
	// CRIU then thaws the sandbox, which keeps running, and one more try
	// usually succeeds.
	for attempt := 1; ; attempt++ {
		err := rc.Checkpoint(ctx, d.CID(id), copts, actions...)
		if err == nil {
			break
		}
		err = d.criuFailed("checkpoint", logFile, work, err)
		if quickState != "" && caughtExiting(work) {
			// A process was mid-exit when the sandbox froze at once
			// (its leader dead, its threads not yet): CRIU cannot dump
			// it. CRIU's own freeze gives exiting tasks time to finish.
			d.log.Info("checkpoint: a process was exiting as the sandbox froze; leaving the freeze to CRIU", "id", id, "err", err)
			thawFile(quickState)
			quickState = ""
			continue
		}
		if !freezeTimedOut(work) {
			return fmt.Errorf("sandbox %s: %w", id, err)
		}
		if attempt == 2 || !d.IsRunning(ctx, id) {
			return fmt.Errorf("sandbox %s: its processes did not freeze within %s (the host is busy); it keeps running: pause again later, or raise the freeze timeout (agentbox serve --criu-freeze-timeout): %w: %w",
				id, d.cfg.FreezeTimeout, errdefs.ErrUnavailable, err)
		}
		d.log.Warn("checkpoint: freeze timed out, trying once more", "id", id, "timeout", d.cfg.FreezeTimeout)
	}
	if err := os.WriteFile(filepath.Join(img, nftLockMarker), nil, 0o600); err != nil {
		return fmt.Errorf("sandbox %s: image: %w", id, err)
	}
	if base, ok := bundle.BundleRange(dir); ok && ns.OwnNet {
		// The restored tasks read part of the image themselves, as the
		// sandbox's mapped root, which must also be able to walk there.
		if err := shareImage(img, int(base)); err != nil {
			return fmt.Errorf("sandbox %s: image: %w", id, err)
		}
		if err := bundle.EnsureSearchableBy(filepath.Dir(img), int(base)); err != nil {
			return fmt.Errorf("sandbox %s: image: %w", id, err)
		}
		// The image is restored in this range and owned by it: the
		// range stays taken while the image exists.
		if !own {
			if err := d.b.WriteImageRange(img, base); err != nil {
				return fmt.Errorf("sandbox %s: image: %w", id, err)
			}
		}
	}
	if opts.UpperCopy != "" {
		if err := d.b.CaptureUpper(ctx, id, opts.UpperCopy); err != nil {
			return err
		}
	}
	if !opts.LeaveRunning {
		frozen.Gone() // the processes are gone; nothing to thaw
		if ns.OwnNet {
			// The netns is in the image; the live one and its veth
			// must go so the restore can make them again.
			if err := d.cfg.Net.Unplug(ctx, id); err != nil {
				d.log.Warn("checkpointed sandbox's old netns not released", "id", id, "err", err)
			}
		}
	}
	if own {
		return bundle.CommitImage(dir, img, id)
	}
	return nil
}

// checkpointUserNS refuses to checkpoint a sandbox whose user namespace
// runc made itself (no path in config.json): CRIU requires every namespace
// of the dumped tasks to be owned by their user namespace, and that
// sandbox's netns belongs to the host's. The error says so instead of
// CRIU's "namespaces doesn't belong to the target user namespace".
// Sandboxes whose netns runc made with their user namespace are fine.
func checkpointUserNS(id string, ns bundle.NS) error {
	if ns.UserNS && ns.NetPath != "" {
		return fmt.Errorf("sandbox %s runs in a user namespace that does not own its network namespace (a server without deferred networking created it), which pause, snapshots and forks cannot checkpoint; recreate the sandbox: %w", id, errdefs.ErrUnavailable)
	}
	return nil
}

// HasCheckpoint reports whether the sandbox has a complete pause image. A
// dump interrupted after CRIU finished (the server died before the rename)
// is recognised by CRIU's final stats file and a container that is gone.
func (d *Driver) HasCheckpoint(ctx context.Context, id string) (bool, error) {
	complete := func(img string) bool {
		_, err := os.Stat(filepath.Join(img, criuInventory))
		return err == nil
	}
	finished := func(img string) bool {
		_, err := os.Stat(filepath.Join(img, criuStatsDump))
		return err == nil
	}
	if bundle.CheckID(id) == nil {
		d.settleLazy(ctx, id)
	}
	return d.b.HasImage(ctx, id, complete, finished, func(ctx context.Context) bool { return d.FinishDump(ctx, id) })
}

// DropCheckpoint removes the sandbox's pause image.
// After a lazy resume the image goes once all memory is loaded.
func (d *Driver) DropCheckpoint(ctx context.Context, id string) error {
	if bundle.CheckID(id) == nil && d.dropAfterLazy(id) {
		return nil
	}
	return d.b.DropImage(id)
}

// Restore brings a sandbox back from an image, in place (resume) or into a
// new bundle (fork, snapshot).
func (d *Driver) Restore(ctx context.Context, spec runtime.Spec, opts runtime.RestoreOptions) error {
	return d.Base.Restore(spec, opts, func(inPlace bool) error { return d.fsRestore(ctx, spec, inPlace) },
		func(dir, img string, inPlace bool) error { return d.restoreMemory(ctx, spec, opts, dir, img, inPlace) })
}

// restoreMemory restores sandbox spec.ID from the memory image img.
func (d *Driver) restoreMemory(ctx context.Context, spec runtime.Spec, opts runtime.RestoreOptions, dir, img string, inPlace bool) (err error) {
	logFile := filepath.Join(dir, "runc-restore.log")
	rc, err := d.criuClient(logFile)
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(img, criuInventory)); err != nil {
		return fmt.Errorf("sandbox %s: no checkpoint image at %s: %w", spec.ID, img, errdefs.ErrNotFound)
	}
	var rb bundle.Rollback
	defer func() {
		if err != nil {
			rb.Run()
		}
	}()
	if !inPlace {
		// CRIU recreates the user namespace with the mappings in the
		// image: the new sandbox runs in the range the image was taken in
		// (images of a server before per-sandbox ranges: the pool's first).
		base, ok := bundle.ImageRange(img)
		if !ok {
			base = d.b.UserNSBase()
		} else if err := bundle.EnsureSearchable(filepath.Dir(img)); err != nil {
			// The restored tasks read part of the image as the mapped root
			// (an image made on another server arrives in a private dir).
			return fmt.Errorf("sandbox %s: image: %w", spec.ID, err)
		}
		if rb, err = d.b.BuildFromImage(ctx, spec, d.options(), base); err != nil {
			return err
		}
	} else if err := bundle.EnsureRootfs(dir); err != nil {
		return fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	ownNet := bundle.OwnsNetNS(dir)
	if !ownNet && !inPlace {
		// The image's netns is external: the new sandbox's must exist.
		if err := d.cfg.Net.Plug(ctx, spec.ID, 0); err != nil {
			return fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
	}
	var conf []string
	if _, err := os.Stat(filepath.Join(img, nftLockMarker)); err == nil {
		conf = append(conf, nftLockConf)
	}
	if opts.NewNetwork {
		// Old connections cannot be re-bound to an address the sandbox no
		// longer has, so they come back closed.
		conf = append(conf, "tcp-close")
	}
	var pw *plugWait
	defer func() {
		if pw != nil {
			pw.close()
		}
	}()
	plugHook := func() error {
		if !ownNet {
			return nil
		}
		// runc has CRIU restore the sandbox into an empty netns (its
		// checkpoints never include one) and runs the prestart hooks once
		// the namespaces exist: the hook has the server give it eth0
		// back before the sockets are restored (plugwait.go). A failed
		// restore took the veth with it; plugging again makes a new pair.
		if pw != nil {
			pw.close()
		}
		var err error
		pw, err = listenPlug(ctx, dir, func(ctx context.Context, pid int) error { return d.cfg.Net.Plug(ctx, spec.ID, pid) })
		if err != nil {
			return fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
		if err := setPlugHook(dir, d.b.HookArgv(PlugWaitHook, "--socket", pw.path)); err != nil {
			return fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
		return nil
	}
	if err := plugHook(); err != nil {
		return err
	}
	if !inPlace {
		// A new sandbox restored from memory keeps the boot of its image.
		if err := writeBootID(dir, spec.BootID); err != nil {
			return fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
	}
	if hasBootID(dir) {
		conf = append(conf, bootIDRestoreConf(dir))
	}
	if err := setCRIUConf(dir, conf); err != nil {
		return fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	work := filepath.Join(dir, restoreWorkDir)
	_ = os.RemoveAll(work)
	if err := os.MkdirAll(work, 0o700); err != nil {
		return err
	}
	defer os.RemoveAll(work)
	pidFile := bundle.PidFile(dir)
	_ = os.Remove(pidFile)
	ropts := &gorunc.RestoreOpts{
		CheckpointOpts: gorunc.CheckpointOpts{ImagePath: img, WorkDir: work, FileLocks: true, AllowOpenTCP: !opts.NewNetwork},
		Detach:         true,
		PidFile:        pidFile,
	}
	restore := func() error {
		return d.inSession(func() error {
			return ocicli.NullIO(func(io gorunc.IO) error {
				ropts.IO = io
				_, err := rc.Restore(ctx, d.CID(spec.ID), dir, ropts)
				return err
			})
		})
	}
	// Only a resume of the sandbox's own pause image is lazy: forks
	// share theirs, which outlives them.
	var lazy *lazyDaemon
	if inPlace && opts.ImageDir == "" {
		want, why := d.lazyWanted(img, opts.Lazy)
		if !want && why != "" {
			d.log.Info("resume loads all memory before the sandbox runs: lazy restore unavailable", "id", spec.ID, "why", why)
		}
		if want {
			if lazy, err = d.startLazyPages(ctx, spec.ID, dir, img, work); err != nil {
				d.log.Warn("resume loads all memory before the sandbox runs: the page daemon did not start", "id", spec.ID, "err", err)
				lazy = nil
			}
		}
	}
	if lazy != nil {
		ropts.ExtraArgs = []string{"--lazy-pages"}
	}
	err = restore()
	if err != nil && lazy != nil {
		// Whatever failed, a full restore may not: try it once.
		lazy.kill()
		lerr := d.criuFailed("restore", logFile, work, err)
		_ = d.DeleteContainer(context.WithoutCancel(ctx), spec.ID)
		if uffdFailed(work) {
			d.setLazyOff("userfaultfd unavailable to restored tasks: " + lerr.Error())
		}
		d.log.Warn("lazy resume failed; restoring all memory before the sandbox runs", "id", spec.ID, "err", lerr, "log", filepath.Join(dir, criuLazyFailedLog))
		_ = os.Rename(filepath.Join(work, "restore.log"), filepath.Join(dir, criuLazyFailedLog))
		lazy, ropts.ExtraArgs = nil, nil
		if err := plugHook(); err != nil {
			return err
		}
		_ = os.RemoveAll(work)
		if err := os.MkdirAll(work, 0o700); err != nil {
			return err
		}
		err = restore()
	}
	if lazy != nil {
		if err == nil {
			d.startWatch(spec.ID, dir, lazy)
		} else {
			lazy.kill()
		}
	}
	if err != nil && pidClash(work) {
		// A thread's id was taken in the new pid namespace while CRIU
		// rebuilt it (EEXIST from clone): nothing of the image is at
		// fault, and a second restore in a fresh namespace finds it free.
		d.log.Warn("restore met a taken thread id; restoring once more", "id", spec.ID, "err", d.criuFailed("restore", logFile, work, err))
		_ = d.DeleteContainer(context.WithoutCancel(ctx), spec.ID)
		if err := plugHook(); err != nil {
			return err
		}
		_ = os.RemoveAll(work)
		if err := os.MkdirAll(work, 0o700); err != nil {
			return err
		}
		ropts.ExtraArgs = nil
		err = restore()
	}
	if err != nil {
		// A failed restore may leave a container record or cgroup behind.
		_ = d.DeleteContainer(context.WithoutCancel(ctx), spec.ID)
		return fmt.Errorf("sandbox %s: %w", spec.ID, d.criuFailed("restore", logFile, work, err))
	}
	// CRIU's own log of the restore stays beside runc's (the work dir
	// goes): its elapsed stamps tell CRIU's share of a resume from
	// agentbox's own.
	_ = os.Rename(filepath.Join(work, "restore.log"), filepath.Join(dir, criuRestoreLog))
	pid, perr := bundle.ReadPid(pidFile)
	if perr == nil {
		bundle.RecordSession(dir, pid)
	}
	if ownNet {
		err := perr
		// Again after the hook's (plugging twice is safe): the
		// neighbour entries are seeded once the sandbox runs.
		if err == nil {
			err = d.cfg.Net.Plug(ctx, spec.ID, pid)
		}
		if err != nil {
			_ = d.killLazy(context.WithoutCancel(ctx), spec.ID)
			_ = d.DeleteContainer(context.WithoutCancel(ctx), spec.ID)
			return fmt.Errorf("sandbox %s: network after restore: %w", spec.ID, err)
		}
	}
	// CRIU puts the processes back in their cgroups; the user cgroup's
	// limits and owners are the server's to set again.
	d.reserveForEnvd(spec.ID)
	if d.b.UserNS() {
		// CRIU restores the namespace but not its /proc/sys/user caps.
		// The sandbox runs already; it only keeps the host's caps.
		if err := d.limitUserNS(ctx, spec.ID, pid); err != nil {
			d.log.Warn("restored sandbox keeps default inotify caps", "id", spec.ID, "err", err)
		}
	}
	return nil
}

// uffdFailed reports whether the failed restore whose CRIU work dir is
// work could not make the tasks' userfaultfds.
// pidClash reports whether a restore failed because a thread id it had to
// recreate was in use (CRIU: "Unable to create a thread: -17").
func pidClash(work string) bool {
	b, err := os.ReadFile(filepath.Join(work, "restore.log"))
	return err == nil && bytes.Contains(b, []byte("Unable to create a thread: -17"))
}

func uffdFailed(work string) bool {
	b, err := os.ReadFile(filepath.Join(work, "restore.log"))
	return err == nil && (bytes.Contains(b, []byte("Lazy pages are not available")) || bytes.Contains(b, []byte("Unable to open an userfaultfd")))
}

// fsRestore boots the sandbox fresh: in place on its bundle (whose rootfs
// still has its writable layer), or as a new sandbox whose top layer is the
// captured one.
func (d *Driver) fsRestore(ctx context.Context, spec runtime.Spec, inPlace bool) error {
	if !inPlace {
		return d.Create(ctx, spec)
	}
	return d.BootInPlace(ctx, spec.ID, func(dir string) error {
		if err := criuUnlock(dir); err != nil {
			return err
		}
		if err := setCRIUConf(dir, nil); err != nil {
			return err
		}
		if err := clearPlugHook(dir); err != nil { // left by a memory restore
			return err
		}
		return writeBootID(dir, spec.BootID) // a new boot
	}, func(dir string) error {
		// A fresh boot is a fresh user namespace: start sets its caps.
		_, err := d.start(ctx, spec.ID, dir, bundle.OwnsNetNS(dir))
		return err
	})
}
