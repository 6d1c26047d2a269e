package runc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
)

var _ runtime.Checkpointer = (*Runtime)(nil)

// Bundle entries of the pause image. CRIU writes into checkpointTmp; the
// rename to checkpointDir marks the image complete, so a crash mid-dump never
// leaves something that looks resumable but is not.
const (
	checkpointDir = "checkpoint"
	checkpointTmp = "checkpoint.tmp"
	criuWorkDir   = "criu-work"
	// forkCRIUConf is the per-restore CRIU configuration of a sandbox
	// restored into another network namespace: its old connections cannot
	// be re-bound to an address it no longer has, so they come back closed.
	forkCRIUConf = "criu-restore.conf"
	// criuStatsDump is the last file CRIU writes into a complete dump image.
	criuStatsDump = "stats-dump"
)

// DefaultCRIUPath is where scripts/install-deps.sh installs a CRIU new
// enough for this kernel (>= 4.2: older ones cannot dump TCP sockets on
// kernels >= 6.16), beside the distribution's own.
const DefaultCRIUPath = "/usr/local/libexec/agentbox/criu"

// criu finds the CRIU binary once: DefaultCRIUPath, then criu from PATH.
type criuFinder struct {
	once sync.Once
	path string
	err  error
}

var errNoCRIU = errors.New("no CRIU >= 4.2 found (install it with scripts/install-deps.sh)")

func (r *Runtime) criu() (string, error) {
	r.criuOnce.once.Do(func() {
		for _, p := range []string{r.cfg.CRIUPath, DefaultCRIUPath, "criu"} {
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
				r.criuOnce.path = bin
				return
			}
			r.log.Warn("CRIU too old for checkpoints on this kernel; need >= 4.2", "criu", bin, "version", strings.TrimSpace(string(out)))
		}
		r.criuOnce.err = fmt.Errorf("%w: %w", errNoCRIU, errdefs.ErrUnavailable)
	})
	return r.criuOnce.path, r.criuOnce.err
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
func (r *Runtime) CheckpointSupported() error {
	_, err := r.criu()
	return err
}

// runcCRIU runs a runc command that drives CRIU. Its stdio is /dev/null:
// a restored container inherits it.
func (r *Runtime) runcCRIU(ctx context.Context, logFile string, args ...string) error {
	criu, err := r.criu()
	if err != nil {
		return err
	}
	full := append([]string{"--root", r.cfg.RuncRoot, "--criu", criu, "--log", logFile, "--log-format", "json"}, args...)
	cmd := exec.CommandContext(ctx, r.cfg.RuncBinary, full...)
	var stderr bytes.Buffer
	if args[0] != "restore" {
		cmd.Stderr = &stderr
	}
	if err := r.runCmd(cmd, args[0] == "restore"); err != nil {
		msg := lastLogError(logFile)
		if msg == "" {
			msg = strings.TrimSpace(stderr.String())
		}
		return fmt.Errorf("runc %s: %w: %s%s", args[0], err, msg, criuLogHint(logFile, args))
	}
	return nil
}

// criuLogHint points at CRIU's own log, where the real reason is.
func criuLogHint(runcLog string, args []string) string {
	for i, a := range args {
		if a == "--work-path" && i+1 < len(args) {
			name := "dump.log"
			if args[0] == "restore" {
				name = "restore.log"
			}
			p := filepath.Join(args[i+1], name)
			if b, err := os.ReadFile(p); err == nil {
				// The first error is the cause; later ones are the unwinding
				// (the rlimit one is a known, harmless warning of this build).
				for l := range strings.SplitSeq(string(b), "\n") {
					if strings.Contains(l, "Error") && !strings.Contains(l, "RLIMIT_NOFILE") {
						return " (criu: " + strings.TrimSpace(l) + ")"
					}
				}
			}
		}
	}
	return ""
}

// Checkpoint dumps the sandbox with CRIU. Established TCP connections (the
// gateway's, a client's) are dumped too, so they continue after a resume.
func (r *Runtime) Checkpoint(ctx context.Context, id string, opts runtime.CheckpointOptions) (err error) {
	if !validID.MatchString(id) {
		return fmt.Errorf("sandbox id %q: %w", id, errdefs.ErrInvalidArgument)
	}
	dir := r.dir(id)
	if _, err := os.Stat(filepath.Join(dir, "config.json")); err != nil {
		return fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	if opts.FilesystemOnly {
		return r.fsCheckpoint(ctx, id, opts)
	}
	if r.tierOf(id) == TierRunsc {
		return r.runscCheckpoint(ctx, id, opts)
	}
	ns, err := readBundleNS(dir)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	if err := checkpointUserNS(id, ns); err != nil {
		return err
	}
	if _, err := r.criu(); err != nil {
		return err
	}
	img, own, err := r.imageDir(id, opts)
	if err != nil {
		return err
	}
	work := filepath.Join(dir, criuWorkDir)
	_ = os.RemoveAll(work)
	if err := os.MkdirAll(work, 0o700); err != nil {
		return err
	}
	defer func() {
		if err != nil && own {
			_ = os.RemoveAll(img)
		}
	}()

	// The writable layer must be copied while the processes are stopped:
	// CRIU checks every open file against the image at restore, and a later
	// copy would silently disagree with memory (appended logs). Freezing
	// first makes dump + copy one consistent instant; CRIU leaves a frozen
	// cgroup frozen.
	frozen := false
	if opts.UpperCopy != "" || opts.LeaveRunning {
		if err := r.Freeze(ctx, id); err != nil {
			return err
		}
		frozen = true
		defer func() {
			if frozen {
				if terr := r.Thaw(context.WithoutCancel(ctx), id); terr != nil {
					err = errors.Join(err, terr)
				}
			}
		}()
	}
	args := []string{"checkpoint", "--tcp-established", "--file-locks", "--image-path", img, "--work-path", work}
	if opts.LeaveRunning {
		args = append(args, "--leave-running")
	}
	args = append(args, id)
	if err := r.runcCRIU(ctx, filepath.Join(dir, "runc-checkpoint.log"), args...); err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	if base, ok := bundleRange(dir); ok && ns.ownNet {
		// The restored tasks read part of the image themselves, as the
		// sandbox's mapped root, which must also be able to walk there.
		if err := shareImage(img, int(base)); err != nil {
			return fmt.Errorf("sandbox %s: image: %w", id, err)
		}
		if err := ensureSearchable(filepath.Dir(img)); err != nil {
			return fmt.Errorf("sandbox %s: image: %w", id, err)
		}
		// The image is restored in this range and owned by it: the
		// range stays taken while the image exists.
		if !own {
			if err := r.writeImageRange(img, base); err != nil {
				return fmt.Errorf("sandbox %s: image: %w", id, err)
			}
		}
	}
	if opts.UpperCopy != "" {
		if err := r.captureUpper(ctx, id, opts.UpperCopy); err != nil {
			return err
		}
	}
	if !opts.LeaveRunning {
		frozen = false // the processes are gone; nothing to thaw
		if ns.ownNet && r.cfg.Net != nil {
			// The netns is in the image; the live one and its veth
			// must go so the restore can make them again.
			if err := r.cfg.Net.Unplug(ctx, id); err != nil {
				r.log.Warn("checkpointed sandbox's old netns not released", "id", id, "err", err)
			}
		}
	}
	if own {
		return commitImage(dir, img, id)
	}
	return nil
}

// copyTree copies dir src to dst (which must not exist) with ownership,
// modes, xattrs (overlay opaque markers) and whiteout devices intact.
func copyTree(ctx context.Context, src, dst string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, "cp", "-a", "--reflink=auto", src, dst).CombinedOutput()
	if err != nil {
		return fmt.Errorf("cp %s: %w: %s", src, err, bytes.TrimSpace(out))
	}
	return nil
}

func syncDir(dir string) {
	if f, err := os.Open(dir); err == nil {
		_ = f.Sync()
		f.Close()
	}
}

// HasCheckpoint reports whether the sandbox has a complete pause image. A
// dump interrupted after CRIU finished (the server died before the rename)
// is recognised by CRIU's final stats file and a container that is gone.
func (r *Runtime) HasCheckpoint(ctx context.Context, id string) (bool, error) {
	if !validID.MatchString(id) {
		return false, fmt.Errorf("sandbox id %q: %w", id, errdefs.ErrInvalidArgument)
	}
	dir := r.dir(id)
	if _, err := os.Stat(filepath.Join(dir, checkpointDir, "inventory.img")); err == nil || runscHasImage(filepath.Join(dir, checkpointDir)) || fsOnlyImage(filepath.Join(dir, checkpointDir)) {
		return true, nil
	}
	tmp := filepath.Join(dir, checkpointTmp)
	if _, err := os.Stat(filepath.Join(tmp, criuStatsDump)); err != nil && !runscHasImage(tmp) && !fsOnlyImage(tmp) {
		_ = os.RemoveAll(tmp)
		return false, nil
	}
	st, err := r.State(ctx, id)
	if err == nil && st == runtime.StatusStopped {
		// CRIU (or runsc) completed and stopped the tasks; only the
		// runtime's cleanup and our rename were missed.
		_, _ = r.oci(ctx, id, "", "delete", "--force", id)
		if err := os.Rename(tmp, filepath.Join(dir, checkpointDir)); err != nil {
			return false, err
		}
		return true, nil
	}
	_ = os.RemoveAll(tmp)
	return false, nil
}

// DropCheckpoint removes the sandbox's pause image.
func (r *Runtime) DropCheckpoint(ctx context.Context, id string) error {
	if !validID.MatchString(id) {
		return fmt.Errorf("sandbox id %q: %w", id, errdefs.ErrInvalidArgument)
	}
	dir := r.dir(id)
	return errors.Join(os.RemoveAll(filepath.Join(dir, checkpointDir)), os.RemoveAll(filepath.Join(dir, checkpointTmp)),
		os.RemoveAll(filepath.Join(dir, criuWorkDir)))
}

// Restore brings a sandbox back from an image, in place (resume) or into a
// new bundle (fork, snapshot).
func (r *Runtime) Restore(ctx context.Context, spec runtime.Spec, opts runtime.RestoreOptions) (err error) {
	if !validID.MatchString(spec.ID) {
		return fmt.Errorf("sandbox id %q: %w", spec.ID, errdefs.ErrInvalidArgument)
	}
	dir := r.dir(spec.ID)
	img := opts.ImageDir
	inPlace := false
	if _, serr := os.Stat(filepath.Join(dir, "config.json")); serr == nil {
		inPlace = true
	}
	if img == "" {
		img = filepath.Join(dir, checkpointDir)
	}
	if opts.FilesystemOnly || fsOnlyImage(img) {
		return r.fsRestore(ctx, spec, inPlace)
	}
	if (inPlace && r.tierOf(spec.ID) == TierRunsc) || (!inPlace && spec.Runtime == TierRunsc) {
		if r.cfg.Net != nil && !inPlace {
			// A new sandbox joins a netns of the host's user namespace.
			if err := r.cfg.Net.Plug(ctx, spec.ID, 0); err != nil {
				return fmt.Errorf("sandbox %s: %w", spec.ID, err)
			}
		}
		return r.runscRestore(ctx, spec, opts, inPlace, img)
	}
	if _, err := r.criu(); err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(img, "inventory.img")); err != nil {
		return fmt.Errorf("sandbox %s: no checkpoint image at %s: %w", spec.ID, img, errdefs.ErrNotFound)
	}
	var rb rollback
	defer func() {
		if err != nil {
			rb.run()
		}
	}()
	if !inPlace {
		// CRIU recreates the user namespace with the mappings in the
		// image: the new sandbox runs in the range the image was taken in
		// (images of a server before per-sandbox ranges: the pool's first).
		base, ok := imageRange(img)
		if !ok {
			base = r.cfg.UserNSBase
		}
		if rb, err = r.newBundle(ctx, spec, opts, base); err != nil {
			return err
		}
	} else if err := r.ensureRootfs(dir); err != nil {
		return fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	ownNet := bundleOwnsNetNS(dir)
	if !ownNet && !inPlace && r.cfg.Net != nil {
		// The image's netns is external: the new sandbox's must exist.
		if err := r.cfg.Net.Plug(ctx, spec.ID, 0); err != nil {
			return fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
	}
	var conf []string
	if opts.NewNetwork {
		// Old connections cannot be re-bound to an address the sandbox no
		// longer has, so they come back closed.
		conf = append(conf, "tcp-close")
	}
	if ownNet {
		// runc has CRIU restore the sandbox into an empty netns (its
		// checkpoints never include one) and runs the prestart hooks once
		// the namespaces exist: the hook gives it eth0 back before the
		// sockets are restored.
		if r.cfg.Net == nil {
			return fmt.Errorf("sandbox %s: its netns is its own but no network plugger is configured: %w", spec.ID, errdefs.ErrInvalidArgument)
		}
		args, err := r.cfg.Net.PlugHook(ctx, spec.ID)
		if err != nil {
			return fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
		if err := setPlugHook(dir, r.hookArgv(args...)); err != nil {
			return fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
	}
	if len(conf) > 0 {
		if err := setCRIUConf(dir, conf); err != nil {
			return fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
	}
	work := filepath.Join(dir, "criu-restore-work")
	_ = os.RemoveAll(work)
	if err := os.MkdirAll(work, 0o700); err != nil {
		return err
	}
	defer os.RemoveAll(work)
	_ = os.Remove(pidFile(dir))
	args := []string{"restore", "--detach", "--file-locks", "--pid-file", pidFile(dir), "--image-path", img, "--work-path", work, "--bundle", dir}
	if !opts.NewNetwork {
		args = append(args, "--tcp-established")
	}
	args = append(args, spec.ID)
	if err := r.runcCRIU(ctx, filepath.Join(dir, "runc-restore.log"), args...); err != nil {
		// A failed restore may leave a container record or cgroup behind.
		_, _ = r.runc(context.WithoutCancel(ctx), "", "delete", "--force", spec.ID)
		return fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	if opts.NewNetwork {
		// The annotation also reaches CRIU on the next dump, where
		// tcp-close would drop live connections: keep only the rest.
		if err := setCRIUConf(dir, nil); err != nil {
			r.log.Warn("restored sandbox keeps tcp-close for its next pause", "id", spec.ID, "err", err)
		}
	}
	pid, perr := readPid(pidFile(dir))
	if perr == nil {
		recordSession(dir, pid)
	}
	if ownNet {
		err := perr
		if err == nil {
			err = r.cfg.Net.Plug(ctx, spec.ID, pid)
		}
		if err != nil {
			_, _ = r.runc(context.WithoutCancel(ctx), "", "delete", "--force", spec.ID)
			return fmt.Errorf("sandbox %s: network after restore: %w", spec.ID, err)
		}
	}
	if r.cfg.UserNS {
		// CRIU restores the namespace but not its /proc/sys/user caps.
		// The sandbox runs already; it only keeps the host's caps.
		if err := r.limitUserNS(ctx, spec.ID, pid); err != nil {
			r.log.Warn("restored sandbox keeps default inotify caps", "id", spec.ID, "err", err)
		}
	}
	return nil
}

// ensureRootfs checks that the bundle's overlay is still mounted (it is
// unless the host rebooted, which also loses the network namespace).
func (r *Runtime) ensureRootfs(dir string) error {
	rootfs := filepath.Join(dir, "rootfs")
	var st, parent unix.Stat_t
	if err := unix.Stat(rootfs, &st); err != nil {
		return err
	}
	if err := unix.Stat(dir, &parent); err != nil {
		return err
	}
	if st.Dev == parent.Dev {
		return fmt.Errorf("rootfs %s is not mounted: %w", rootfs, errdefs.ErrUnavailable)
	}
	return nil
}

// newBundle builds the bundle of a sandbox restored from another one's
// image: the overlay over spec.Layers (whose top is the captured writable
// layer), a fresh upper, config.json for the new id, netns and cgroup, and
// the captured log dir (envd's log is open in the image).
func (r *Runtime) newBundle(ctx context.Context, spec runtime.Spec, opts runtime.RestoreOptions, base uint32) (rollback, error) {
	var rb rollback
	dir := r.dir(spec.ID)
	if len(spec.Layers) == 0 {
		return rb, fmt.Errorf("sandbox %s: no rootfs layers: %w", spec.ID, errdefs.ErrInvalidArgument)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return rb, fmt.Errorf("sandbox %s: %w", spec.ID, errdefs.ErrConflict)
		}
		return rb, fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	rb.add(func() { _ = os.RemoveAll(dir) })
	if err := os.WriteFile(filepath.Join(dir, idFile), []byte(spec.ID+"\n"), 0o600); err != nil {
		return rb, fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	if r.usernsEnabled(spec.Runtime) {
		if err := r.uids.hold(base, dir); err != nil {
			return rb, fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "rootfs"), 0o755); err != nil {
		return rb, fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	// The new writable layer gets the same kind of disk as a fresh sandbox.
	onDisk := spec.Resources.DiskMB > 0
	if onDisk {
		if err := r.mountDisk(ctx, dir, spec.Resources.DiskMB); err != nil {
			return rb, fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
		rb.add(func() { _ = unmountDisk(dir) })
	}
	upper, work := layerDirs(dir, onDisk)
	if !onDisk {
		for _, d := range []string{upper, work} {
			if err := os.Mkdir(d, 0o755); err != nil {
				return rb, fmt.Errorf("sandbox %s: %w", spec.ID, err)
			}
		}
	}
	top := spec.Layers[len(spec.Layers)-1]
	if err := copyTree(ctx, top+".log", filepath.Join(dir, "log")); err != nil {
		if err := os.Mkdir(filepath.Join(dir, "log"), 0o755); err != nil {
			return rb, fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
	} else if r.usernsEnabled(spec.Runtime) {
		// envd's log is open in the image: its owner must be the new
		// sandbox's (the capture is stored unshifted).
		if err := r.shiftInto(filepath.Join(dir, "log"), base); err != nil {
			return rb, fmt.Errorf("sandbox %s: log dir: %w", spec.ID, err)
		}
	}
	rootfs := filepath.Join(dir, "rootfs")
	lower := slices.Clone(spec.Layers)
	if r.usernsEnabled(spec.Runtime) {
		var err error
		if lower, err = r.mappedLayers(ctx, lower, base); err != nil {
			return rb, fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
		if err := r.prepareUserNSBundle(dir, base, upper); err != nil {
			return rb, fmt.Errorf("sandbox %s: user namespace: %w", spec.ID, err)
		}
	}
	slices.Reverse(lower)
	mopts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", strings.Join(lower, ":"), upper, work)
	err := unix.Mount("overlay", rootfs, "overlay", 0, mopts)
	r.idmapsMounted(lower)
	if err != nil {
		return rb, fmt.Errorf("sandbox %s: mount overlay: %w", spec.ID, err)
	}
	rb.add(func() { _ = unmount(rootfs) })
	if err := writeEtc(dir, spec); err != nil {
		return rb, fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	oci := r.ociSpec(spec, dir, base)
	cfgJSON, err := json.MarshalIndent(oci, "", "\t")
	if err != nil {
		return rb, err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), cfgJSON, 0o600); err != nil {
		return rb, err
	}
	rb.add(func() { _ = r.removeCgroups(r.cgroupPath(spec.ID)) })
	return rb, nil
}

// Freeze stops every task of the sandbox with the cgroup freezer.
func (r *Runtime) Freeze(ctx context.Context, id string) error {
	if !validID.MatchString(id) {
		return fmt.Errorf("sandbox id %q: %w", id, errdefs.ErrInvalidArgument)
	}
	var err error
	// The v1 freezer gives up ("unable to freeze") when a task is caught
	// mid-fork or the host is busy; runc thaws back, so trying again is safe
	// and nearly always succeeds.
	for attempt := 1; ; attempt++ {
		_, err = r.oci(ctx, id, "", "pause", id)
		if err == nil || attempt == 5 || !strings.Contains(err.Error(), "unable to freeze") {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("sandbox %s: %w", id, ctx.Err())
		case <-time.After(time.Duration(attempt) * 50 * time.Millisecond):
		}
	}
	if err != nil {
		if notExist(err) {
			return fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
		}
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	return nil
}

// Thaw resumes a frozen sandbox.
func (r *Runtime) Thaw(ctx context.Context, id string) error {
	if !validID.MatchString(id) {
		return fmt.Errorf("sandbox id %q: %w", id, errdefs.ErrInvalidArgument)
	}
	if _, err := r.oci(ctx, id, "", "resume", id); err != nil {
		if notExist(err) {
			return fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
		}
		if strings.Contains(err.Error(), "not paused") {
			return nil
		}
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	return nil
}

// imageDir prepares where a checkpoint image is written: opts.ImageDir when
// the caller names one, else the bundle's temporary image dir (own), which
// commitImage renames into place only once the image is complete.
func (r *Runtime) imageDir(id string, opts runtime.CheckpointOptions) (img string, own bool, err error) {
	img, own = opts.ImageDir, opts.ImageDir == ""
	if own {
		img = filepath.Join(r.dir(id), checkpointTmp)
		if err := os.RemoveAll(img); err != nil {
			return "", false, err
		}
	}
	if err := os.MkdirAll(img, 0o700); err != nil {
		return "", false, fmt.Errorf("sandbox %s: image dir: %w", id, err)
	}
	return img, own, nil
}

// commitImage makes a complete image in the bundle the sandbox's pause image.
func commitImage(dir, img, id string) error {
	if err := os.Rename(img, filepath.Join(dir, checkpointDir)); err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	syncDir(dir)
	return nil
}

// captureUpper copies the sandbox's writable layer to dest and its log dir
// to dest+".log": envd's log is open in a memory image, so a restore from
// the copy needs the file there.
func (r *Runtime) captureUpper(ctx context.Context, id, dest string) error {
	dir := r.dir(id)
	upper, _ := layerDirs(dir, r.diskMB(id) > 0)
	if err := r.copyUnshifted(ctx, dir, upper, dest); err != nil {
		return fmt.Errorf("sandbox %s: capture writable layer: %w", id, err)
	}
	if err := r.copyUnshifted(ctx, dir, filepath.Join(dir, "log"), dest+".log"); err != nil {
		return fmt.Errorf("sandbox %s: capture log dir: %w", id, err)
	}
	return nil
}

// shiftInto moves the owners of the tree at path (unshifted, or shifted
// into another pool range by an earlier version) into the range at base.
func (r *Runtime) shiftInto(path string, base uint32) error {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return err
	}
	from, ok := r.uids.rangeOf(st.Uid)
	if !ok {
		from = 0
	}
	if from == base {
		return nil
	}
	return shiftTree(path, from, base, r.cfg.UserNSSize)
}

// copyUnshifted copies src of bundle dir to dst with its owners moved out
// of the sandbox's host id range back to 0.., so the copy (a captured
// writable layer) can be idmapped into any sandbox's range and holds none.
func (r *Runtime) copyUnshifted(ctx context.Context, dir, src, dst string) error {
	if err := copyTree(ctx, src, dst); err != nil {
		return err
	}
	base, ok := bundleRange(dir)
	if !ok {
		return nil
	}
	if err := shiftTree(dst, base, 0, r.cfg.UserNSSize); err != nil {
		_ = os.RemoveAll(dst)
		return fmt.Errorf("unshift the copy: %w", err)
	}
	return nil
}
