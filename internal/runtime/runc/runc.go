// Package runc runs sandboxes as runc containers: it owns each sandbox's
// bundle directory (overlay rootfs over the template layers, config.json,
// /etc files, log dir), the container in runc's state root and its cgroups.
// Everything lives on disk, so a restarted server finds, inspects and
// deletes what an earlier process started.
package runc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/seccomprules"
)

// Config configures the runc driver. Zero values take the defaults.
type Config struct {
	// StateDir holds one bundle directory per sandbox, <StateDir>/<id>.
	// Required (e.g. /var/lib/agentbox/sandboxes).
	StateDir string
	// RuncBinary is the runc executable. Default "runc" from PATH.
	RuncBinary string
	// RuncRoot is runc's --root (container state). Default /run/agentbox/runc.
	RuncRoot string
	// EnvdPath is the host path of the static envd binary, bind-mounted
	// read-only at runtime.EnvdPathInSandbox. Required.
	EnvdPath string
	// CgroupParent is the cgroup (relative to each hierarchy's root) under
	// which every sandbox gets <CgroupParent>/<id>. Default "agentbox".
	CgroupParent string
	// RunscBinary is gVisor's runsc, for the runsc tier. Default "runsc"
	// from PATH; when it is missing that tier says how to install it.
	RunscBinary string
	// RunscRoot is runsc's --root. Default <RuncRoot>-runsc.
	RunscRoot string
	// RunscPlatform is runsc's --platform. Default systrap (needs no KVM).
	RunscPlatform string
	// DiskImageDir caches the formatted empty images that size-limited
	// writable layers are copied from. Default <StateDir>/../disk-images.
	DiskImageDir string
	// CRIUPath is the CRIU binary for checkpoints (>= 4.2). Default:
	// DefaultCRIUPath, then criu from PATH.
	CRIUPath string
	// UserNS runs container-tier sandboxes in a user namespace of their
	// own, each with a host id range of its own (see userns.go).
	UserNS bool
	// UserNSBase is the first host id of the pool of ranges, UserNSSize
	// the ids of one sandbox's range and UserNSRanges the number of
	// ranges (uidrange.go). Defaults DefaultUserNSBase, DefaultUserNSSize
	// and DefaultUserNSRanges.
	UserNSBase, UserNSSize, UserNSRanges uint32
	// UIDRangeDir records which ranges are in use. Default
	// <StateDir>/../uid-ranges.
	UIDRangeDir string
	// Net, when set, receives every sandbox's network namespace: the
	// network package only pre-makes the veth pair (network.Config
	// Deferred) and Spec.NetNSPath is a placeholder until Net.Plug. It
	// lets a sandbox in a user namespace own its netns, which CRIU needs.
	Net NetPlugger
	// HookBinary is the agentbox binary, whose hidden `__hook` subcommand
	// runs the runtime's helpers (network plug on restore, user namespace
	// limits). Required with UserNS.
	HookBinary string
}

// NetPlugger is the network side of sandboxes whose netns the runtime
// makes (network.Manager implements it).
type NetPlugger interface {
	// Plug pins and configures the netns of process pid (0: make one in
	// the host's user namespace) as sandbox id's.
	Plug(ctx context.Context, id string, pid int) error
	// Unplug lets go of the netns of a sandbox whose processes are gone.
	Unplug(ctx context.Context, id string) error
	// PlugHook returns the arguments of `agentbox __hook` that, given the
	// sandbox's OCI state on stdin, wire a just-restored netns up (run as
	// a runc hook).
	PlugHook(ctx context.Context, id string) ([]string, error)
}

// Runtime is the runc driver. It keeps no state in memory besides its
// configuration, so it is safe for concurrent use and across restarts.
type Runtime struct {
	cfg      Config
	log      *slog.Logger
	cgroupV2 bool
	nofile   uint64 // RLIMIT_NOFILE given to envd
	runscBin string // "" when runsc is not installed
	criuOnce criuFinder
	idmap    idmapper
	// auditSyscalls is envd's --audit-syscalls list (see harden).
	auditSyscalls string
	secret        []byte // keys host paths (hostpaths.go)
	uids          uidPool
	tiers         *runtime.Tiers
}

// The driver's optional capabilities.
var (
	_ runtime.Checkpointer     = (*Runtime)(nil)
	_ runtime.CheckpointProber = (*Runtime)(nil)
	_ runtime.LimitReporter    = (*Runtime)(nil)
	_ runtime.TierChecker      = (*Runtime)(nil)
	_ runtime.SandboxResolver  = (*Runtime)(nil)
)

var _ runtime.Runtime = (*Runtime)(nil)

// validID matches ids that are safe as a runc container id, a directory name
// and a cgroup name.
var validID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// New checks cfg and detects the cgroup version.
func New(cfg Config, log *slog.Logger) (*Runtime, error) {
	if cfg.StateDir == "" {
		return nil, fmt.Errorf("runc: StateDir is required: %w", errdefs.ErrInvalidArgument)
	}
	if cfg.EnvdPath == "" {
		return nil, fmt.Errorf("runc: EnvdPath is required: %w", errdefs.ErrInvalidArgument)
	}
	if cfg.RuncBinary == "" {
		cfg.RuncBinary = "runc"
	}
	if cfg.RuncRoot == "" {
		cfg.RuncRoot = "/run/agentbox/runc"
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = "agentbox"
	}
	bin, err := exec.LookPath(cfg.RuncBinary)
	if err != nil {
		return nil, fmt.Errorf("runc binary %q: %w", cfg.RuncBinary, errdefs.ErrUnavailable)
	}
	cfg.RuncBinary = bin
	if cfg.RunscRoot == "" {
		cfg.RunscRoot = cfg.RuncRoot + "-runsc"
	}
	if cfg.RunscPlatform == "" {
		cfg.RunscPlatform = "systrap"
	}
	if cfg.DiskImageDir == "" {
		cfg.DiskImageDir = filepath.Join(filepath.Dir(cfg.StateDir), "disk-images")
	}
	if cfg.RunscBinary == "" {
		cfg.RunscBinary = "runsc"
	}
	runscBin, _ := exec.LookPath(cfg.RunscBinary)
	if cfg.UserNSBase == 0 {
		cfg.UserNSBase = DefaultUserNSBase
	}
	if cfg.UserNSSize == 0 {
		cfg.UserNSSize = DefaultUserNSSize
	}
	if cfg.UserNSRanges == 0 {
		cfg.UserNSRanges = DefaultUserNSRanges
	}
	if uint64(cfg.UserNSBase)+uint64(cfg.UserNSSize)*uint64(cfg.UserNSRanges) > 1<<32-2 {
		return nil, fmt.Errorf("runc: %d ranges of %d host ids from %d pass the largest uid: %w", cfg.UserNSRanges, cfg.UserNSSize, cfg.UserNSBase, errdefs.ErrInvalidArgument)
	}
	if cfg.UIDRangeDir == "" {
		cfg.UIDRangeDir = filepath.Join(filepath.Dir(cfg.StateDir), "uid-ranges")
	}
	if log == nil {
		log = slog.Default()
	}
	// Searchable (mapped roots walk to their own bundle), never listable:
	// entries are named by sandbox (keys here, ids in runc's state root).
	for _, d := range []string{cfg.StateDir, cfg.RuncRoot} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return nil, fmt.Errorf("runc: %w", err)
		}
		if err := os.Chmod(d, 0o711); err != nil {
			return nil, fmt.Errorf("runc: %w", err)
		}
	}
	if cfg.UserNS {
		if err := ensureSearchable(cfg.StateDir); err != nil {
			return nil, fmt.Errorf("runc: user namespaces: %w", err)
		}
		if err := raiseHostInotify(); err != nil {
			return nil, fmt.Errorf("runc: user namespaces: raise the host's inotify limits: %w", err)
		}
	}
	secret, err := loadSecret(cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("runc: %w", err)
	}
	r := &Runtime{cfg: cfg, log: log.With("component", "runc"), cgroupV2: isCgroupV2(), secret: secret}
	r.uids = uidPool{dir: cfg.UIDRangeDir, base: cfg.UserNSBase, size: cfg.UserNSSize, count: cfg.UserNSRanges}
	r.idmap.dir = r.idmapDir()
	r.auditSyscalls = seccomprules.AuditedSyscalls()
	r.resetIdmaps()
	r.nofile = r.nofileLimit()
	r.runscBin = runscBin
	if r.tiers, err = r.newTiers(); err != nil {
		return nil, err
	}
	if err := r.setupCgroupParent(); err != nil { // cgroupparent.go
		return nil, err
	}
	return r, nil
}

// wantNOFILE is the open-files limit sandboxes get where the host allows it.
const wantNOFILE = 1048576

// nofileLimit returns wantNOFILE, or the server's own hard limit when the
// server lacks CAP_SYS_RESOURCE and runc therefore cannot raise it.
func (r *Runtime) nofileLimit() uint64 {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil || lim.Max >= wantNOFILE || hasCap(unix.CAP_SYS_RESOURCE) {
		return wantNOFILE
	}
	r.log.Warn("no CAP_SYS_RESOURCE: sandboxes get the server's open-files limit", "nofile", lim.Max, "wanted", wantNOFILE)
	return lim.Max
}

// hasCap reports whether the process has capability c in its effective set.
func hasCap(c int) bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			var mask uint64
			if _, err := fmt.Sscanf(strings.TrimSpace(v), "%x", &mask); err != nil {
				return false
			}
			return mask&(1<<uint(c)) != 0
		}
	}
	return false
}

// runc runs one runc command. Its stdio never reaches the container: with
// run --detach the container inherits runc's stdio, and a pipe there would
// both hang Wait and make the container uncheckpointable. Errors are read
// from runc's own log file instead.
func (r *Runtime) runc(ctx context.Context, logFile string, args ...string) ([]byte, error) {
	full := append([]string{"--root", r.cfg.RuncRoot}, args...)
	if logFile != "" {
		full = append([]string{"--log", logFile, "--log-format", "json"}, full...)
	}
	cmd := exec.CommandContext(ctx, r.cfg.RuncBinary, full...)
	var stdout, stderr bytes.Buffer
	// run and create leave the sandbox's init holding runc's stdio: it
	// must be /dev/null, not a pipe Run would wait on.
	if args[0] != "run" && args[0] != "create" {
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
	}
	if err := r.runCmd(cmd, args[0] == "run" || args[0] == "create"); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if logFile != "" {
			msg = lastLogError(logFile)
		}
		return nil, fmt.Errorf("runc %s: %w: %s", args[0], err, msg)
	}
	return stdout.Bytes(), nil
}

// runCmd runs cmd, in a new audit session of the sandbox (see session.go)
// when session is set.
func (r *Runtime) runCmd(cmd *exec.Cmd, session bool) error {
	var err error
	if session {
		err = inSession(r.cfg.UserNSBase, cmd.Start)
	} else {
		err = cmd.Start()
	}
	if err != nil {
		return err
	}
	return cmd.Wait()
}

// lastLogError returns the last error message in a runc JSON log.
func lastLogError(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	var msg string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		var e struct{ Level, Msg string }
		if json.Unmarshal(sc.Bytes(), &e) == nil && e.Level == "error" {
			msg = e.Msg
		}
	}
	return msg
}

func notExist(err error) bool {
	return err != nil && strings.Contains(err.Error(), "does not exist")
}

// rollback undoes completed setup steps in reverse order.
type rollback []func()

func (rb *rollback) add(f func()) { *rb = append(*rb, f) }
func (rb rollback) run() {
	for i := len(rb) - 1; i >= 0; i-- {
		rb[i]()
	}
}

// Create builds the bundle and starts envd as the container's init.
func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) (err error) {
	switch {
	case !validID.MatchString(spec.ID):
		return fmt.Errorf("sandbox id %q: %w", spec.ID, errdefs.ErrInvalidArgument)
	case len(spec.Layers) == 0:
		return fmt.Errorf("sandbox %s: no rootfs layers: %w", spec.ID, errdefs.ErrInvalidArgument)
	case r.TierAvailable(spec.Runtime) != nil:
		return fmt.Errorf("sandbox %s: %w", spec.ID, r.TierAvailable(spec.Runtime))
	}
	dir := r.dir(spec.ID)
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("sandbox %s: %w", spec.ID, errdefs.ErrConflict)
		}
		return fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	var rb rollback
	defer func() {
		if err != nil {
			rb.run()
		}
	}()
	rb.add(func() { _ = os.RemoveAll(dir) })
	if err := os.WriteFile(filepath.Join(dir, idFile), []byte(spec.ID+"\n"), 0o600); err != nil {
		return fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	tier := spec.Runtime
	if tier == "" {
		tier = TierRunc
	}
	var base uint32
	if r.usernsEnabled(tier) {
		// Held by the bundle dir: free again once it is gone.
		if base, err = r.uids.alloc(dir); err != nil {
			return fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
	}

	for _, sub := range []string{"upper", "work", "rootfs", "log"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o755); err != nil {
			return fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, tierFile), []byte(tier+"\n"), 0o600); err != nil {
		return fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	onDisk := spec.Resources.DiskMB > 0
	if onDisk {
		if err := r.mountDisk(ctx, dir, spec.Resources.DiskMB); err != nil {
			return fmt.Errorf("sandbox %s: writable layer: %w", spec.ID, err)
		}
		rb.add(func() { _ = unmountDisk(dir) })
	}
	upper, work := layerDirs(dir, onDisk)
	rootfs := filepath.Join(dir, "rootfs")
	lower := slices.Clone(spec.Layers)
	if r.usernsEnabled(tier) {
		if lower, err = r.mappedLayers(ctx, lower, base); err != nil {
			return fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
		if err := r.prepareUserNSBundle(dir, base, upper); err != nil {
			return fmt.Errorf("sandbox %s: user namespace: %w", spec.ID, err)
		}
	}
	slices.Reverse(lower) // overlay wants the topmost layer first
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", strings.Join(lower, ":"), upper, work)
	err = unix.Mount("overlay", rootfs, "overlay", 0, opts)
	r.idmapsMounted(lower)
	if err != nil {
		return fmt.Errorf("sandbox %s: mount overlay: %w", spec.ID, err)
	}
	rb.add(func() { _ = unmount(rootfs) })

	if err := writeEtc(dir, spec); err != nil {
		return fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	cfgJSON, err := json.MarshalIndent(r.harden(r.ociSpec(spec, dir, base), spec), "", "\t")
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), cfgJSON, 0o600); err != nil {
		return fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}

	rb.add(func() {
		// A failed run may leave a container record or a cgroup behind.
		_, _ = r.oci(context.WithoutCancel(ctx), spec.ID, "", "delete", "--force", spec.ID)
		_ = r.removeCgroups(r.cgroupPath(spec.ID))
	})
	pid, err := r.start(ctx, spec.ID, tier, dir, r.ownsNetNS(spec))
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	if r.usernsEnabled(tier) {
		if err := r.limitUserNS(ctx, spec.ID, pid); err != nil {
			return fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
	}
	r.log.Debug("sandbox started", "id", spec.ID)
	return nil
}

// writeEtc writes the files bind-mounted over the sandbox's /etc/hosts,
// /etc/hostname and /etc/resolv.conf. The hostname resolves locally so
// tools that look it up (getfqdn, sudo) never wait on DNS.
func writeEtc(dir string, spec runtime.Spec) error {
	hosts := "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t" + spec.ID + "\n"
	var resolv strings.Builder
	for _, ns := range spec.DNS {
		fmt.Fprintf(&resolv, "nameserver %s\n", ns)
	}
	for name, content := range map[string]string{
		"hosts":       hosts,
		"hostname":    spec.ID + "\n",
		"resolv.conf": resolv.String(),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// unmount unmounts path, retrying while it is busy (processes of a killed
// container may still be exiting) and detaching it lazily as a last resort.
func unmount(path string) error {
	var err error
	for range 20 {
		err = unix.Unmount(path, 0)
		if err == nil || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if derr := unix.Unmount(path, unix.MNT_DETACH); derr != nil && !errors.Is(derr, unix.EINVAL) {
		return fmt.Errorf("unmount %s: %w", path, errors.Join(err, derr))
	}
	return nil
}

// Delete kills the container and removes its state, rootfs mount, bundle
// directory and cgroups. Deleting an unknown id is not an error.
func (r *Runtime) Delete(ctx context.Context, id string) error {
	if !validID.MatchString(id) {
		return fmt.Errorf("sandbox id %q: %w", id, errdefs.ErrInvalidArgument)
	}
	dir := r.dir(id)
	cgPath := r.bundleCgroupPath(id)
	var errs []error
	if err := r.killInit(ctx, id); err != nil && !notExist(err) {
		r.log.Warn("kill sandbox init; runc delete --force takes over", "id", id, "err", err)
	}
	if _, err := r.oci(ctx, id, "", "delete", "--force", id); err != nil && !notExist(err) {
		errs = append(errs, err)
	}
	if err := unmount(filepath.Join(dir, "rootfs")); err != nil {
		errs = append(errs, err)
	}
	r.releaseIdmaps()
	if err := unmountDisk(dir); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		errs = append(errs, err)
	}
	if err := r.removeCgroups(cgPath); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("delete sandbox %s: %w", id, err)
	}
	return nil
}

// bundleCgroupPath reads the cgroup path from the bundle, so a sandbox
// created under another CgroupParent is still found; it falls back to the
// configured one.
func (r *Runtime) bundleCgroupPath(id string) string {
	b, err := os.ReadFile(filepath.Join(r.dir(id), "config.json"))
	if err == nil {
		var s specs.Spec
		if json.Unmarshal(b, &s) == nil && s.Linux != nil && s.Linux.CgroupsPath != "" {
			return s.Linux.CgroupsPath
		}
	}
	return r.cgroupPath(id)
}

// State reports the container's status. A bundle directory without a runc
// container (a half-done Create or Delete) is reported as stopped so the
// caller deletes it; an id with neither is errdefs.ErrNotFound.
func (r *Runtime) State(ctx context.Context, id string) (runtime.Status, error) {
	if !validID.MatchString(id) {
		return "", fmt.Errorf("sandbox id %q: %w", id, errdefs.ErrInvalidArgument)
	}
	out, err := r.oci(ctx, id, "", "state", id)
	if err != nil {
		if notExist(err) {
			if _, serr := os.Stat(r.dir(id)); serr == nil {
				return runtime.StatusStopped, nil
			}
			return "", fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
		}
		return "", err
	}
	var st struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return "", fmt.Errorf("runc state %s: %w", id, err)
	}
	switch st.Status {
	case "running":
		return runtime.StatusRunning, nil
	case "paused", "pausing":
		return runtime.StatusPaused, nil
	default: // created, stopped
		return runtime.StatusStopped, nil
	}
}

// Stats reads the sandbox's cgroup and the size of its writable layer.
func (r *Runtime) Stats(ctx context.Context, id string) (runtime.Stats, error) {
	if !validID.MatchString(id) {
		return runtime.Stats{}, fmt.Errorf("sandbox id %q: %w", id, errdefs.ErrInvalidArgument)
	}
	dir := r.dir(id)
	if _, err := os.Stat(dir); err != nil {
		return runtime.Stats{}, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	st := runtime.Stats{Timestamp: time.Now()}
	if err := r.cgroupStats(r.bundleCgroupPath(id), &st); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return runtime.Stats{}, fmt.Errorf("sandbox %s cgroup: %w", id, errdefs.ErrNotFound)
		}
		return runtime.Stats{}, fmt.Errorf("sandbox %s stats: %w", id, err)
	}
	st.DiskUsed = diskUsage(filepath.Join(dir, "upper"))
	if mb := r.diskMB(id); mb > 0 {
		st.DiskTotal = uint64(mb) << 20
	} else {
		var sfs unix.Statfs_t
		if err := unix.Statfs(r.cfg.StateDir, &sfs); err == nil {
			st.DiskTotal = sfs.Blocks * uint64(sfs.Bsize)
		}
	}
	if used, total, ok := diskUsageStatfs(dir); ok {
		st.DiskUsed, st.DiskTotal = used, total
	}
	return st, nil
}

// diskMB is the disk limit recorded in the bundle (0 = none).
func (r *Runtime) diskMB(id string) int {
	b, err := os.ReadFile(filepath.Join(r.dir(id), "config.json"))
	if err != nil {
		return 0
	}
	var s specs.Spec
	if json.Unmarshal(b, &s) != nil {
		return 0
	}
	var mb int
	fmt.Sscan(s.Annotations[annotationDiskMB], &mb)
	return mb
}

// annotationDiskMB records Resources.DiskMB in the bundle, for Stats.
const annotationDiskMB = "io.agentbox.disk-mb"

// diskUsage sums allocated blocks under dir.
func diskUsage(dir string) uint64 {
	var total uint64
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			total += uint64(st.Blocks) * 512
		}
		return nil
	})
	return total
}

// List returns the ids that have a bundle directory or a runc container.
func (r *Runtime) List(ctx context.Context) ([]string, error) {
	ids := map[string]bool{}
	entries, err := os.ReadDir(r.cfg.StateDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		if id, ok := r.bundleID(e.Name()); ok {
			ids[id] = true
		}
	}
	out, err := r.runc(ctx, "", "list", "--format", "json")
	if err != nil {
		return nil, err
	}
	var cs []struct {
		ID string `json:"id"`
	}
	if len(bytes.TrimSpace(out)) > 0 {
		if err := json.Unmarshal(out, &cs); err != nil {
			return nil, fmt.Errorf("runc list: %w", err)
		}
	}
	for _, c := range cs {
		ids[c.ID] = true
	}
	gvisor, err := r.runscList(ctx)
	if err != nil {
		return nil, err
	}
	for _, id := range gvisor {
		ids[id] = true
	}
	list := make([]string, 0, len(ids))
	for id := range ids {
		list = append(list, id)
	}
	slices.Sort(list)
	return list, nil
}
