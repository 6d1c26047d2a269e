// Package runsc is the gVisor tier's driver: it runs each sandbox's bundle
// (internal/runtime/bundle, the same one the container tier runs) with
// runsc, whose user-space kernel is the sandbox's kernel, and checkpoints
// it with runsc's own checkpoint. runsc takes runc's command line, so it is
// driven through go-runc with runsc's global flags added.
package runsc

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"

	gorunc "github.com/containerd/go-runc"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/bundle"
	"github.com/agentbox/agentbox/internal/runtime/ocicli"
)

// Name is the tier this driver runs (Spec.Runtime).
const Name = "runsc"

// InstallHint tells an operator how to get the gVisor tier.
const InstallHint = "install a static runsc (scripts/install-deps.sh does: CGO_ENABLED=0 GOFLAGS=-mod=mod go install -ldflags=\"-s -w\" gvisor.dev/gvisor/runsc@v0.0.0-20260905035102-160fafc42237, then copy it to /usr/local/bin) and restart the server"

// Config configures the runsc driver. Zero values take the defaults.
type Config struct {
	// Bundles builds and removes the sandboxes' bundles. Required.
	Bundles *bundle.Store
	// Binary is gVisor's runsc. Default "runsc" from PATH; when it is
	// missing the tier says how to install it.
	Binary string
	// Root is runsc's --root. Required.
	Root string
	// Platform is runsc's --platform. Default systrap (needs no KVM).
	Platform string
	// Net, when set, makes every sandbox's network namespace (in the
	// host's user namespace) before runsc starts it.
	Net runtime.NetPlugger
}

// Driver is the runsc driver. It keeps no state in memory besides its
// configuration, so it is safe for concurrent use and across restarts.
type Driver struct {
	// The base answers State, List, Freeze and Thaw.
	ocicli.Base
	cfg Config
	b   *bundle.Store
	log *slog.Logger
}

// The driver's optional capabilities.
var (
	_ runtime.Runtime       = (*Driver)(nil)
	_ runtime.Checkpointer  = (*Driver)(nil)
	_ runtime.LimitReporter = (*Driver)(nil)
)

// New checks cfg and looks for runsc.
func New(cfg Config, log *slog.Logger) (*Driver, error) {
	if cfg.Bundles == nil || cfg.Root == "" {
		return nil, fmt.Errorf("runsc: Bundles and Root are required: %w", errdefs.ErrInvalidArgument)
	}
	if cfg.Binary == "" {
		cfg.Binary = "runsc"
	}
	if cfg.Platform == "" {
		cfg.Platform = "systrap"
	}
	if log == nil {
		log = slog.Default()
	}
	bin, _ := exec.LookPath(cfg.Binary) // "" when runsc is not installed
	log = log.With("component", "runsc")
	root := cfg.Root
	return &Driver{cfg: cfg, b: cfg.Bundles, log: log, Base: ocicli.Base{
		Name: Name, Binary: bin, Root: root, Bundles: cfg.Bundles, Log: log, FreezeAttempts: 1,
		Unavailable: fmt.Errorf("the gvisor tier needs runsc, which is not installed on this server: %s: %w", InstallHint, errdefs.ErrUnavailable),
		// runsc's own global flags: systrap works without KVM; the
		// sandbox's own netstack uses the prepared netns (runsc moves its
		// addresses inside, so every sandbox needs a fresh netns, which
		// it has); overlay2=none keeps writes on the host overlay, whose
		// upper sits on the size-limited disk and is what the rest of the
		// platform sees.
		ExtraArgs: []string{"--platform=" + cfg.Platform, "--network=sandbox", "--overlay2=none"},
		// runsc keeps <sandbox>_sandbox:<container>.state files.
		HasState: func(name string) bool {
			m, _ := filepath.Glob(filepath.Join(root, "*_sandbox:"+name+".state"))
			return len(m) > 0
		},
	}}, nil
}

// Tier is the driver's entry in the tier registry; its availability check
// says how to install runsc.
func (d *Driver) Tier() runtime.Tier {
	return runtime.Tier{Name: Name, Driver: d, Available: d.Available, Owns: func(id string) bool { return d.b.Tier(id) == Name }}
}

// Create builds the bundle and starts envd as the sandbox's init.
func (d *Driver) Create(ctx context.Context, spec runtime.Spec) error {
	if err := d.Available(); err != nil {
		return fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	return d.BuildAndStart(ctx, spec, options(), func(dir string) error {
		if err := d.start(ctx, spec.ID, dir); err != nil {
			return err
		}
		d.log.Debug("sandbox started", "id", spec.ID)
		return nil
	})
}

// start runs sandbox id's init from its bundle in dir, in a netns of the
// host's user namespace.
func (d *Driver) start(ctx context.Context, id, dir string) error {
	if d.cfg.Net != nil {
		if err := d.cfg.Net.Plug(ctx, id, 0); err != nil {
			return err
		}
	}
	// runsc moves the netns's address into gVisor; a resume needs it back.
	if err := saveNetConf(dir); err != nil {
		return err
	}
	logFile := filepath.Join(dir, Name+".log")
	c, err := d.Client(logFile)
	if err != nil {
		return err
	}
	pidFile := bundle.PidFile(dir)
	_ = os.Remove(pidFile)
	err = ocicli.NullIO(func(io gorunc.IO) error {
		_, err := c.Run(ctx, d.CID(id), dir, &gorunc.CreateOpts{IO: io, PidFile: pidFile, Detach: true})
		return err
	})
	if err != nil {
		return d.Failed("run", logFile, err)
	}
	_, err = bundle.ReadPid(pidFile)
	return err
}

// Stop kills the sandbox's processes and removes its container record (a
// filesystem-only pause); the bundle stays.
func (d *Driver) Stop(ctx context.Context, id string) error {
	if err := d.KillInit(ctx, id); err != nil {
		return err
	}
	if err := d.DeleteContainer(ctx, id); err != nil {
		return err
	}
	// As after a memory pause: a restarted server learns the sandbox's
	// network from the idle netns's address.
	if err := restoreNetConf(d.b.Dir(id)); err != nil {
		d.log.Warn("paused gvisor sandbox: netns address not restored; a server restart will not find its network", "id", id, "err", err)
	}
	return nil
}

// Delete kills the sandbox and removes its container, rootfs mount, bundle
// directory and cgroups. Deleting an unknown id is not an error.
func (d *Driver) Delete(ctx context.Context, id string) error {
	return d.b.Delete(ctx, id, d.KillInit, d.DeleteContainer)
}
