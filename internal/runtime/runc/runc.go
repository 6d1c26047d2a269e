// Package runc is the container tier's driver: it runs each sandbox's
// bundle (internal/runtime/bundle) with runc, in a user namespace and host
// uid range of its own when the store has them, under the shared seccomp
// policy, and checkpoints it with CRIU. It drives runc through go-runc;
// containers live in runc's state root, so a restarted server finds,
// inspects and deletes what an earlier process started.
package runc

import (
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
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	gorunc "github.com/containerd/go-runc"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/bundle"
	"github.com/agentbox/agentbox/internal/runtime/ocicli"
	"github.com/agentbox/agentbox/internal/seccomprules"
)

// Name is the tier this driver runs (Spec.Runtime), the default one.
const Name = "runc"

// Config configures the runc driver. Zero values take the defaults.
type Config struct {
	// Bundles builds and removes the sandboxes' bundles. Required.
	Bundles *bundle.Store
	// Binary is the runc executable. Default "runc" from PATH.
	Binary string
	// Root is runc's --root (container state). Default /run/agentbox/runc.
	Root string
	// CRIUPath is the CRIU binary for checkpoints (>= 4.2). Default:
	// DefaultCRIUPath, then criu from PATH.
	CRIUPath string
	// FreezeTimeout is how long CRIU may take to freeze a sandbox's
	// processes for a pause (CRIU's --timeout, whole seconds). Default
	// DefaultFreezeTimeout; CRIU's own 10 s fails pauses on a busy host.
	FreezeTimeout time.Duration
	// Net (required) receives every sandbox's network namespace: the
	// network package only pre-makes the veth pair (network.Config
	// Deferred) and Spec.NetNSPath is a placeholder until Net.Plug. It
	// lets a sandbox in a user namespace own its netns, which CRIU needs.
	Net runtime.NetPlugger
	// LazyResumeMB is the memory image size (MiB) from which a resume
	// restores lazily: the sandbox runs at once and its memory is loaded
	// on first touch and in the background (lazy.go). Default
	// DefaultLazyResumeMB; negative never.
	LazyResumeMB int
}

// Driver is the runc driver. It keeps no state in memory besides its
// configuration, so it is safe for concurrent use and across restarts.
type Driver struct {
	// The base answers State, List, Freeze and Thaw; runningInit and
	// removeIfInitGone spare it runc execs in the common cases.
	ocicli.Base
	cfg      Config
	b        *bundle.Store
	log      *slog.Logger
	criuOnce criuFinder
	kdat     kdatCache
	lazy     lazyState
	// auditSyscalls is envd's --audit-syscalls list (see harden).
	auditSyscalls string
	// sealed is the sealed copy of runc every runc call executes
	// (sealedbin.go); nil runs the binary's file.
	sealed *sealedBinary
	// sealedInits counts the created inits that ran from the sealed copy;
	// sealedMissed is set once one did not (noteInit).
	sealedInits  atomic.Int64
	sealedMissed atomic.Bool
}

// The driver's optional capabilities.
var (
	_ runtime.Runtime          = (*Driver)(nil)
	_ runtime.Checkpointer     = (*Driver)(nil)
	_ runtime.CheckpointProber = (*Driver)(nil)
	_ runtime.LimitReporter    = (*Driver)(nil)
)

// New checks cfg and makes runc's state root.
func New(cfg Config, log *slog.Logger) (*Driver, error) {
	if cfg.Bundles == nil {
		return nil, fmt.Errorf("runc: Bundles is required: %w", errdefs.ErrInvalidArgument)
	}
	if cfg.Net == nil {
		// A restore into the sandbox's own netns needs it to plug eth0 back.
		return nil, fmt.Errorf("runc: Net is required (the network that plugs a restored sandbox's eth0): %w", errdefs.ErrInvalidArgument)
	}
	if cfg.Binary == "" {
		cfg.Binary = "runc"
	}
	if cfg.Root == "" {
		cfg.Root = "/run/agentbox/runc"
	}
	if cfg.LazyResumeMB == 0 {
		cfg.LazyResumeMB = DefaultLazyResumeMB
	}
	if cfg.FreezeTimeout == 0 {
		cfg.FreezeTimeout = DefaultFreezeTimeout
	}
	if cfg.FreezeTimeout < time.Second {
		return nil, fmt.Errorf("runc: FreezeTimeout %s: want at least 1s (CRIU counts whole seconds): %w", cfg.FreezeTimeout, errdefs.ErrInvalidArgument)
	}
	bin, err := exec.LookPath(cfg.Binary)
	if err != nil {
		return nil, fmt.Errorf("runc binary %q: %w", cfg.Binary, errdefs.ErrUnavailable)
	}
	cfg.Binary = bin
	// Never listable: entries are named by sandbox id.
	if err := bundle.MkdirPrivate(cfg.Root); err != nil {
		return nil, fmt.Errorf("runc: %w", err)
	}
	if log == nil {
		log = slog.Default()
	}
	log = log.With("component", "runc")
	d := &Driver{cfg: cfg, b: cfg.Bundles, log: log, auditSyscalls: seccomprules.AuditedSyscalls()}
	exe := bin
	if sb, err := sealBinary(bin); err != nil {
		log.Warn("runc runs from its file, so each runc init copies itself first", "binary", bin, "err", err)
	} else {
		d.sealed, exe = sb, sb.path
	}
	d.Base = ocicli.Base{
		Name: Name, Binary: exe, Root: cfg.Root, Bundles: cfg.Bundles, Log: log, FreezeAttempts: 5,
		HasState: func(name string) bool {
			_, err := os.Stat(filepath.Join(cfg.Root, name))
			return err == nil
		},
		// A container exists for runc exactly while its state file does.
		Exists: func(name string) bool {
			_, err := os.Stat(filepath.Join(cfg.Root, name, "state.json"))
			return !errors.Is(err, fs.ErrNotExist)
		},
		Running:       d.runningInit,
		RemoveStopped: func(name string) bool { return removeIfInitGone(filepath.Join(cfg.Root, name)) },
	}
	return d, nil
}

// Tier is the driver's entry in the tier registry, the default tier.
func (d *Driver) Tier() runtime.Tier {
	return runtime.Tier{Name: Name, Driver: d, Owns: func(id string) bool { return d.b.Tier(id) == Name }}
}

// client is a go-runc client for one call; logFile "" logs nowhere. New
// found the binary, so it never fails.
func (d *Driver) client(logFile string) *gorunc.Runc {
	c, _ := d.Client(logFile)
	return c
}

// removeIfInitGone removes the record of a container (its runc state
// directory dir) when runc's state file shows that its init is surely gone (not the process
// that has its pid now, not a zombie): for a stopped container `runc
// delete` only removes its cgroups, which the bundle's removal does too,
// and that record (it runs no poststop hooks: the driver's bundles have
// none). Saving that exec saves a Go runtime start on every kill. Anything
// else, or anything unreadable, is left to `runc delete --force`.
func removeIfInitGone(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "state.json"))
	if err != nil {
		return false
	}
	var st struct {
		Pid   int    `json:"init_process_pid"`
		Start uint64 `json:"init_process_start"`
	}
	if json.Unmarshal(b, &st) != nil || st.Pid <= 0 || st.Start == 0 {
		return false
	}
	if stat, err := os.ReadFile("/proc/" + strconv.Itoa(st.Pid) + "/stat"); err == nil {
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(f) < 20 || (f[19] == strconv.FormatUint(st.Start, 10) && f[0] != "Z" && f[0] != "X") {
			return false // alive, or unknown
		}
	} else if !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, unix.ESRCH) {
		return false
	}
	return os.RemoveAll(dir) == nil
}

// options are the bundle options of this tier's sandboxes.
func (d *Driver) options() bundle.Options {
	return bundle.Options{Tier: Name, UserNS: d.b.UserNS(), OwnNet: d.ownsNetNS(), Harden: d.harden, HidePaths: true}
}

// Create builds the bundle and starts envd as the container's init.
func (d *Driver) Create(ctx context.Context, spec runtime.Spec) error {
	o := d.options()
	t0 := time.Now()
	return d.BuildAndStart(ctx, spec, o, func(dir string) error {
		// config.json names the file already (harden).
		if err := writeCRIUConf(dir, nil); err != nil {
			return err
		}
		if err := writeBootID(dir, spec.BootID); err != nil {
			return err
		}
		t1 := time.Now()
		pid, err := d.start(ctx, spec.ID, dir, o.OwnNet)
		if err != nil {
			return err
		}
		d.log.Debug("sandbox started", "id", spec.ID, "pid", pid, "bundle", t1.Sub(t0).Round(time.Microsecond),
			"runc and hook", time.Since(t1).Round(time.Microsecond))
		return nil
	})
}

// Delete kills the sandbox and removes its container, rootfs mount, bundle
// directory and cgroups. Deleting an unknown id is not an error.
func (d *Driver) Delete(ctx context.Context, id string) error {
	if err := bundle.CheckID(id); err != nil {
		return err
	}
	// A page daemon still loading the sandbox's memory serves nobody now.
	if err := d.killLazy(ctx, id); err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	return d.b.Delete(ctx, id, d.KillInit, d.DeleteContainer)
}

// runningInit returns the host pid of sandbox id's init when runc's state
// file shows, without a runc exec, that it surely runs: the init lives
// (same pid and start time), it was started (no exec fifo) and its cgroup
// is not frozen. Anything else, or anything unreadable, is false and left
// to `runc state`.
func (d *Driver) runningInit(id string) (int, bool) {
	dir := filepath.Join(d.cfg.Root, d.CID(id))
	b, err := os.ReadFile(filepath.Join(dir, "state.json"))
	if err != nil {
		return 0, false
	}
	var st struct {
		Pid     int               `json:"init_process_pid"`
		Start   uint64            `json:"init_process_start"`
		Cgroups map[string]string `json:"cgroup_paths"`
	}
	if json.Unmarshal(b, &st) != nil || st.Pid <= 0 {
		return 0, false
	}
	if _, err := os.Stat(filepath.Join(dir, "exec.fifo")); !errors.Is(err, fs.ErrNotExist) {
		return 0, false // created, not started (or unknown)
	}
	f, err := procStat(st.Pid)
	if err != nil || f[0] == "Z" || f[0] == "X" || f[19] != strconv.FormatUint(st.Start, 10) {
		return 0, false
	}
	thawed := false
	if p, ok := st.Cgroups["freezer"]; ok {
		v, err := os.ReadFile(filepath.Join(p, "freezer.state"))
		thawed = err == nil && strings.TrimSpace(string(v)) == "THAWED"
	} else if p, ok := st.Cgroups[""]; ok {
		v, err := os.ReadFile(filepath.Join(p, "cgroup.freeze"))
		thawed = err == nil && strings.TrimSpace(string(v)) == "0"
	}
	return st.Pid, thawed
}
