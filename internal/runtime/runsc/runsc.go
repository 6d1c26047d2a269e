// Package runsc is the gVisor tier's driver: it runs each sandbox's bundle
// (internal/runtime/bundle, the same one the container tier runs) with
// runsc, whose user-space kernel is the sandbox's kernel, and checkpoints
// it with runsc's own checkpoint. runsc takes runc's command line, so it is
// driven through go-runc with runsc's global flags added.
package runsc

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"

	gorunc "github.com/containerd/go-runc"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/bundle"
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
	cfg Config
	b   *bundle.Store
	log *slog.Logger
	bin string // "" when runsc is not installed
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
	bin, _ := exec.LookPath(cfg.Binary)
	return &Driver{cfg: cfg, b: cfg.Bundles, log: log.With("component", "runsc"), bin: bin}, nil
}

// Tier is the driver's entry in the tier registry; its availability check
// says how to install runsc.
func (d *Driver) Tier() runtime.Tier {
	return runtime.Tier{Name: Name, Driver: d, Available: d.available, Owns: func(id string) bool { return d.b.Tier(id) == Name }}
}

func (d *Driver) available() error {
	if d.bin == "" {
		return fmt.Errorf("the gvisor tier needs runsc, which is not installed on this server: %s: %w", InstallHint, errdefs.ErrUnavailable)
	}
	return nil
}

// client is a go-runc client for one runsc call; logFile "" logs nowhere.
// runsc's own global flags go in ExtraArgs: systrap works without KVM;
// the sandbox's own netstack uses the prepared netns (runsc moves its
// addresses inside, so every sandbox needs a fresh netns, which it has);
// overlay2=none keeps writes on the host overlay, whose upper sits on the
// size-limited disk and is what the rest of the platform sees.
func (d *Driver) client(logFile string) (*gorunc.Runc, error) {
	if err := d.available(); err != nil {
		return nil, err
	}
	c := &gorunc.Runc{Command: d.bin, Root: d.cfg.Root,
		ExtraArgs: []string{"--platform=" + d.cfg.Platform, "--network=sandbox", "--overlay2=none"}}
	if logFile != "" {
		c.Log, c.LogFormat = logFile, gorunc.JSON
	}
	return c, nil
}

// nullIO runs f with /dev/null as runsc's stdio: a started or restored
// sandbox inherits it.
func nullIO(f func(gorunc.IO) error) error {
	io, err := gorunc.NewNullIO()
	if err != nil {
		return err
	}
	defer io.Close()
	return f(io)
}

// failed wraps a runsc failure with the reason runsc logged.
func failed(verb, logFile string, err error) error {
	if msg := lastRunscError(logFile); msg != "" {
		return fmt.Errorf("runsc %s: %w: %s", verb, err, msg)
	}
	return fmt.Errorf("runsc %s: %w", verb, err)
}

// lastRunscError returns the last warning or error of a runsc JSON log.
func lastRunscError(path string) string {
	if path == "" {
		return ""
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	var msg, last string
	for line := range bytes.SplitSeq(b, []byte("\n")) {
		var e struct {
			Level string `json:"level"`
			Msg   string `json:"msg"`
		}
		if json.Unmarshal(line, &e) == nil && e.Msg != "" {
			last = e.Msg
			if e.Level == "error" || e.Level == "warning" {
				msg = e.Msg
			}
		}
	}
	if msg == "" {
		// runsc often fails without an error line; its last words help.
		msg = last
	}
	return msg
}

// containers returns the names of runsc's containers (see cid).
func (d *Driver) containers(ctx context.Context) ([]string, error) {
	c, err := d.client("")
	if err != nil {
		return nil, nil
	}
	if _, err := os.Stat(d.cfg.Root); err != nil {
		return nil, nil
	}
	cs, err := c.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("runsc list: %w", err)
	}
	names := make([]string, 0, len(cs))
	for _, c := range cs {
		names = append(names, c.ID)
	}
	return names, nil
}

// cid is sandbox id's container name for runsc: its host key (runsc's
// sandbox and gofer processes carry it on their command lines, which every
// host user reads in /proc), or the id itself for a container an earlier
// version started (runsc keeps <sandbox>_sandbox:<container>.state files).
func (d *Driver) cid(id string) string {
	return d.b.ContainerID(id, func(name string) bool {
		m, _ := filepath.Glob(filepath.Join(d.cfg.Root, "*_sandbox:"+name+".state"))
		return len(m) > 0
	})
}

// exists reports whether runsc has a container id. go-runc reports
// runsc's failures as text only; runsc's list is the typed answer.
func (d *Driver) exists(ctx context.Context, id string) bool {
	ids, err := d.containers(ctx)
	return err != nil || slices.Contains(ids, d.cid(id))
}

// state returns runsc's state of container id.
func (d *Driver) state(ctx context.Context, id string) (*gorunc.Container, error) {
	c, err := d.client("")
	if err != nil {
		return nil, err
	}
	return c.State(ctx, d.cid(id))
}

// deleteContainer removes sandbox id's container record, killing what is
// left of it; a container that does not exist is not an error.
func (d *Driver) deleteContainer(ctx context.Context, id string) error {
	c, err := d.client("")
	if err != nil {
		return err
	}
	if err := c.Delete(ctx, d.cid(id), &gorunc.DeleteOpts{Force: true}); err != nil && d.exists(ctx, id) {
		return fmt.Errorf("runsc delete %s: %w", id, err)
	}
	return nil
}

// Create builds the bundle and starts envd as the sandbox's init.
func (d *Driver) Create(ctx context.Context, spec runtime.Spec) (err error) {
	if err := d.available(); err != nil {
		return fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	built, rb, err := d.b.Build(ctx, spec, options())
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			rb.Run()
		}
	}()
	rb.Add(func() {
		// A failed run may leave a container record or a cgroup behind.
		_ = d.deleteContainer(context.WithoutCancel(ctx), spec.ID)
		_ = d.b.RemoveCgroups(d.b.CgroupPath(spec.ID))
	})
	if err := d.start(ctx, spec.ID, built.Dir); err != nil {
		return fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	d.log.Debug("sandbox started", "id", spec.ID)
	return nil
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
	c, err := d.client(logFile)
	if err != nil {
		return err
	}
	pidFile := bundle.PidFile(dir)
	_ = os.Remove(pidFile)
	err = nullIO(func(io gorunc.IO) error {
		_, err := c.Run(ctx, d.cid(id), dir, &gorunc.CreateOpts{IO: io, PidFile: pidFile, Detach: true})
		return err
	})
	if err != nil {
		return failed("run", logFile, err)
	}
	_, err = bundle.ReadPid(pidFile)
	return err
}

// killInit SIGKILLs the sandbox's init and waits until it has exited. A
// container that does not exist is not an error.
func (d *Driver) killInit(ctx context.Context, id string) error {
	st, err := d.state(ctx, id)
	if err != nil {
		if !d.exists(ctx, id) {
			return nil
		}
		return fmt.Errorf("runsc state %s: %w", id, err)
	}
	if st.Pid <= 0 || st.Status == "stopped" {
		return nil
	}
	if st.Status == "paused" {
		// A paused sandbox does not die until resumed.
		if err := d.resume(ctx, id); err != nil {
			return err
		}
	}
	return bundle.KillWait(ctx, id, st.Pid)
}

// Stop kills the sandbox's processes and removes its container record (a
// filesystem-only pause); the bundle stays.
func (d *Driver) Stop(ctx context.Context, id string) error {
	if err := d.killInit(ctx, id); err != nil {
		return err
	}
	if err := d.deleteContainer(ctx, id); err != nil {
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
	return d.b.Delete(ctx, id, d.killInit, d.deleteContainer)
}

// State reports the sandbox's status. A bundle directory without a runsc
// container (a half-done Create or Delete, a paused sandbox) is reported as
// stopped; an id with neither is errdefs.ErrNotFound.
func (d *Driver) State(ctx context.Context, id string) (runtime.Status, error) {
	if err := bundle.CheckID(id); err != nil {
		return "", err
	}
	st, err := d.state(ctx, id)
	if err != nil {
		if !d.exists(ctx, id) {
			return d.b.StatusWithoutContainer(id)
		}
		return "", fmt.Errorf("runsc state %s: %w", id, err)
	}
	return bundle.ContainerStatus(st.Status), nil
}

// Stats reads the sandbox's cgroup and the size of its writable layer.
func (d *Driver) Stats(ctx context.Context, id string) (runtime.Stats, error) {
	return d.b.Stats(id)
}

// LimitCounters reads the limit hits of the sandbox's cgroup.
func (d *Driver) LimitCounters(ctx context.Context, id string) (runtime.LimitCounters, error) {
	return d.b.LimitCounters(id)
}

// List returns the ids that have a bundle directory or a runsc container.
func (d *Driver) List(ctx context.Context) ([]string, error) {
	ids, err := d.b.List()
	if err != nil {
		return nil, err
	}
	names, err := d.containers(ctx)
	if err != nil {
		return nil, err
	}
	for _, name := range names {
		id, ok := d.b.SandboxOfContainer(name)
		if !ok {
			// Its bundle (which names its sandbox) is gone: nothing
			// could ever find it again.
			d.log.Warn("runsc container without a bundle; removing it", "container", name)
			if c, err := d.client(""); err == nil {
				if err := c.Delete(ctx, name, &gorunc.DeleteOpts{Force: true}); err != nil {
					d.log.Warn("remove orphaned runsc container", "container", name, "err", err)
				}
			}
			continue
		}
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return slices.Compact(ids), nil
}

// Freeze pauses every task of the sandbox (runsc pause).
func (d *Driver) Freeze(ctx context.Context, id string) error {
	if err := bundle.CheckID(id); err != nil {
		return err
	}
	c, err := d.client("")
	if err != nil {
		return err
	}
	if err := c.Pause(ctx, d.cid(id)); err != nil {
		if !d.exists(ctx, id) {
			return fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
		}
		return fmt.Errorf("sandbox %s: runsc pause: %w", id, err)
	}
	return nil
}

// Thaw resumes a paused sandbox; one that is not paused is left as it is.
func (d *Driver) Thaw(ctx context.Context, id string) error {
	if err := bundle.CheckID(id); err != nil {
		return err
	}
	if err := d.resume(ctx, id); err != nil {
		if !d.exists(ctx, id) {
			return fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
		}
		if st, serr := d.state(ctx, id); serr == nil && st.Status != "paused" {
			return nil // not paused: nothing to resume
		}
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	return nil
}

func (d *Driver) resume(ctx context.Context, id string) error {
	c, err := d.client("")
	if err != nil {
		return err
	}
	if err := c.Resume(ctx, d.cid(id)); err != nil {
		return fmt.Errorf("runsc resume %s: %w", id, err)
	}
	return nil
}
