// Package ocicli is the base of the drivers whose OCI runtime takes runc's
// command line (runc, gVisor's runsc): it drives the binary through
// go-runc and owns what every such driver does alike — naming a sandbox's
// container, asking whether it exists and how it runs, killing and
// deleting it, listing containers (removing those whose bundle is gone),
// freezing and thawing. A driver embeds Base and adds its start, its
// checkpoint and its faster paths.
package ocicli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"time"

	gorunc "github.com/containerd/go-runc"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/bundle"
)

// Base drives one OCI runtime binary. Its methods State, Stats,
// LimitCounters, List, Freeze and Thaw are the embedding driver's.
type Base struct {
	// Name is the binary's name in messages ("runc", "runsc").
	Name string
	// Binary is the executable's path; "" when it is not installed, which
	// Unavailable then explains.
	Binary string
	// Root is the runtime's --root (its container state).
	Root string
	// ExtraArgs are global flags added to every call.
	ExtraArgs []string
	// Bundles is the sandboxes' bundle store.
	Bundles *bundle.Store
	Log     *slog.Logger
	// Unavailable is the error while Binary is "".
	Unavailable error
	// HasState reports whether the runtime keeps a container named name
	// in Root (for sandboxes an earlier version named by their id).
	HasState func(name string) bool
	// Exists, if set, answers whether container name exists without a
	// `list` exec; otherwise the runtime's list is asked.
	Exists func(name string) bool
	// Running, if set, returns the init pid of a sandbox it can tell
	// surely runs without an exec; false leaves it to `state`.
	Running func(id string) (int, bool)
	// RemoveStopped, if set, removes the record of a container whose init
	// is surely gone without a `delete` exec, reporting whether it did.
	RemoveStopped func(name string) bool
	// FreezeAttempts is how often Freeze tries while the sandbox still
	// runs after a failed pause. Default 1.
	FreezeAttempts int
}

// Available reports nil when the binary is installed.
func (b *Base) Available() error {
	if b.Binary == "" {
		return b.Unavailable
	}
	return nil
}

// Client is a go-runc client for one call; logFile "" logs nowhere.
func (b *Base) Client(logFile string) (*gorunc.Runc, error) {
	if err := b.Available(); err != nil {
		return nil, err
	}
	c := &gorunc.Runc{Command: b.Binary, Root: b.Root, ExtraArgs: b.ExtraArgs}
	if logFile != "" {
		c.Log, c.LogFormat = logFile, gorunc.JSON
	}
	return c, nil
}

// NullIO runs f with /dev/null as the runtime's stdio. With create, run
// and restore the sandbox's init inherits it: a pipe there would both hang
// the wait for the runtime and make the sandbox uncheckpointable, so
// errors are read from the runtime's log file instead.
func NullIO(f func(gorunc.IO) error) error {
	io, err := gorunc.NewNullIO()
	if err != nil {
		return err
	}
	defer io.Close()
	return f(io)
}

// Failed wraps a failure of the runtime's verb with the reason it logged.
func (b *Base) Failed(verb, logFile string, err error) error {
	if msg := LastLogError(logFile); msg != "" {
		return fmt.Errorf("%s %s: %w: %s", b.Name, verb, err, msg)
	}
	return fmt.Errorf("%s %s: %w", b.Name, verb, err)
}

// LastLogError returns the last error or warning of a runtime's JSON log,
// else its last words (runsc often fails without an error line).
func LastLogError(path string) string {
	if path == "" {
		return ""
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	var msg, last string
	for line := range bytes.SplitSeq(data, []byte("\n")) {
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
		msg = last
	}
	return msg
}

// CID is sandbox id's container name: its host key (the runtime's command
// lines, world-readable in /proc while they run, name it), or the id
// itself for a container an earlier version started.
func (b *Base) CID(id string) string { return b.Bundles.ContainerID(id, b.HasState) }

// containers returns the names of the runtime's containers; none when the
// runtime is not installed or has never run.
func (b *Base) containers(ctx context.Context) ([]string, error) {
	c, err := b.Client("")
	if err != nil {
		return nil, nil
	}
	if _, err := os.Stat(b.Root); err != nil {
		return nil, nil
	}
	cs, err := c.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s list: %w", b.Name, err)
	}
	names := make([]string, 0, len(cs))
	for _, c := range cs {
		names = append(names, c.ID)
	}
	return names, nil
}

// ContainerExists reports whether the runtime has sandbox id's container.
// go-runc reports the runtime's failures as text only, so this is the
// typed answer; when unsure it says yes.
func (b *Base) ContainerExists(ctx context.Context, id string) bool {
	if b.Exists != nil {
		return b.Exists(b.CID(id))
	}
	names, err := b.containers(ctx)
	return err != nil || slices.Contains(names, b.CID(id))
}

// ContainerState returns the runtime's state of sandbox id's container.
func (b *Base) ContainerState(ctx context.Context, id string) (*gorunc.Container, error) {
	c, err := b.Client("")
	if err != nil {
		return nil, err
	}
	return c.State(ctx, b.CID(id))
}

// IsRunning reports whether the runtime sees sandbox id running.
func (b *Base) IsRunning(ctx context.Context, id string) bool {
	c, err := b.ContainerState(ctx, id)
	return err == nil && c.Status == "running"
}

// DeleteContainer removes sandbox id's container record, killing what is
// left of it; a container that does not exist is not an error.
func (b *Base) DeleteContainer(ctx context.Context, id string) error {
	if b.RemoveStopped != nil && b.RemoveStopped(b.CID(id)) {
		return nil
	}
	c, err := b.Client("")
	if err != nil {
		return err
	}
	if err := c.Delete(ctx, b.CID(id), &gorunc.DeleteOpts{Force: true}); err != nil && b.ContainerExists(ctx, id) {
		return fmt.Errorf("%s delete %s: %w", b.Name, id, err)
	}
	return nil
}

// KillInit SIGKILLs the sandbox's init and waits until it has exited,
// which (being its pid namespace's init) means every sandbox process is
// gone; faster than the polling of `delete --force` on a running
// container. A container that does not exist is not an error.
func (b *Base) KillInit(ctx context.Context, id string) error {
	if b.Running != nil {
		if pid, ok := b.Running(id); ok {
			return bundle.KillWait(ctx, id, pid)
		}
	}
	st, err := b.ContainerState(ctx, id)
	if err != nil {
		if !b.ContainerExists(ctx, id) {
			return nil
		}
		return fmt.Errorf("%s state %s: %w", b.Name, id, err)
	}
	if st.Pid <= 0 || st.Status == "stopped" {
		return nil
	}
	if st.Status == "paused" {
		// Frozen tasks do not die until thawed.
		if err := b.resume(ctx, id); err != nil {
			return err
		}
	}
	return bundle.KillWait(ctx, id, st.Pid)
}

// State reports the sandbox's status. A bundle directory without a
// container (a half-done Create or Delete, a sandbox paused to an image)
// is reported as stopped so the caller deletes or resumes it; an id with
// neither is errdefs.ErrNotFound.
func (b *Base) State(ctx context.Context, id string) (runtime.Status, error) {
	if err := bundle.CheckID(id); err != nil {
		return "", err
	}
	if b.Running != nil {
		if _, ok := b.Running(id); ok {
			return runtime.StatusRunning, nil
		}
	}
	st, err := b.ContainerState(ctx, id)
	if err != nil {
		if !b.ContainerExists(ctx, id) {
			return b.Bundles.StatusWithoutContainer(id)
		}
		return "", fmt.Errorf("%s state %s: %w", b.Name, id, err)
	}
	return bundle.ContainerStatus(st.Status), nil
}

// FinishDump is a HasCheckpoint's last step for a dump the server died
// in: when the runtime completed it (the sandbox stopped), only the
// container's removal was missed, which it does now.
func (b *Base) FinishDump(ctx context.Context, id string) bool {
	st, err := b.State(ctx, id)
	if err != nil || st != runtime.StatusStopped {
		return false
	}
	_ = b.DeleteContainer(ctx, id)
	return true
}

// Stats reads the sandbox's cgroup and the size of its writable layer.
func (b *Base) Stats(ctx context.Context, id string) (runtime.Stats, error) {
	return b.Bundles.Stats(id)
}

// LimitCounters reads the limit hits of the sandbox's cgroup.
func (b *Base) LimitCounters(ctx context.Context, id string) (runtime.LimitCounters, error) {
	return b.Bundles.LimitCounters(id)
}

// List returns the ids that have a bundle directory or a container.
func (b *Base) List(ctx context.Context) ([]string, error) {
	ids, err := b.Bundles.List()
	if err != nil {
		return nil, err
	}
	names, err := b.containers(ctx)
	if err != nil {
		return nil, err
	}
	for _, name := range names {
		id, ok := b.Bundles.SandboxOfContainer(name)
		if !ok {
			// Its bundle (which names its sandbox) is gone: nothing
			// could ever find it again.
			b.Log.Warn("container without a bundle; removing it", "runtime", b.Name, "container", name)
			if c, err := b.Client(""); err == nil {
				if err := c.Delete(ctx, name, &gorunc.DeleteOpts{Force: true}); err != nil {
					b.Log.Warn("remove orphaned container", "runtime", b.Name, "container", name, "err", err)
				}
			}
			continue
		}
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return slices.Compact(ids), nil
}

// Freeze stops every task of the sandbox in place (`pause`). The cgroup
// v1 freezer gives up ("unable to freeze") when a task is caught mid-fork
// or the host is busy and the runtime thaws back, so a sandbox found
// running after a failed pause is tried again, up to FreezeAttempts.
func (b *Base) Freeze(ctx context.Context, id string) error {
	if err := bundle.CheckID(id); err != nil {
		return err
	}
	c, err := b.Client("")
	if err != nil {
		return err
	}
	for attempt := 1; ; attempt++ {
		err = c.Pause(ctx, b.CID(id))
		if err == nil || attempt >= b.FreezeAttempts || !b.IsRunning(ctx, id) {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("sandbox %s: %w", id, ctx.Err())
		case <-time.After(time.Duration(attempt) * 50 * time.Millisecond):
		}
	}
	if err != nil {
		if !b.ContainerExists(ctx, id) {
			return fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
		}
		return fmt.Errorf("sandbox %s: %s pause: %w", id, b.Name, err)
	}
	return nil
}

// Thaw resumes a frozen sandbox; one that is not frozen is left as it is.
func (b *Base) Thaw(ctx context.Context, id string) error {
	if err := bundle.CheckID(id); err != nil {
		return err
	}
	if err := b.resume(ctx, id); err != nil {
		if !b.ContainerExists(ctx, id) {
			return fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
		}
		if st, serr := b.ContainerState(ctx, id); serr == nil && st.Status != "paused" {
			return nil // not frozen: nothing to thaw
		}
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	return nil
}

func (b *Base) resume(ctx context.Context, id string) error {
	c, err := b.Client("")
	if err != nil {
		return err
	}
	if err := c.Resume(ctx, b.CID(id)); err != nil {
		return fmt.Errorf("%s resume %s: %w", b.Name, id, err)
	}
	return nil
}

// BuildAndStart builds sandbox spec.ID's bundle with o and runs start on
// its directory. On error nothing is left: the bundle's steps are undone
// after the container record and cgroups a failed start may leave.
func (b *Base) BuildAndStart(ctx context.Context, spec runtime.Spec, o bundle.Options, start func(dir string) error) (err error) {
	built, rb, err := b.Bundles.Build(ctx, spec, o)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			rb.Run()
		}
	}()
	rb.Add(func() {
		_ = b.DeleteContainer(context.WithoutCancel(ctx), spec.ID)
		_ = b.Bundles.RemoveCgroups(b.Bundles.CgroupPath(spec.ID))
	})
	if err := start(built.Dir); err != nil {
		return fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	return nil
}

// Restore is the start of every restore of sandbox spec.ID: it finds its
// bundle and image (opts.ImageDir, or "" for its own pause image) and
// whether it resumes in place (the bundle is still there) rather than into
// a new bundle, then hands a filesystem-only image (or request) to fs and
// a memory image to mem.
func (b *Base) Restore(spec runtime.Spec, opts runtime.RestoreOptions, fs func(inPlace bool) error, mem func(dir, img string, inPlace bool) error) error {
	if err := bundle.CheckID(spec.ID); err != nil {
		return err
	}
	dir := b.Bundles.Dir(spec.ID)
	img := opts.ImageDir
	inPlace := false
	if _, err := os.Stat(filepath.Join(dir, "config.json")); err == nil {
		inPlace = true
	}
	if img == "" {
		img = filepath.Join(dir, bundle.CheckpointDir)
	}
	if opts.FilesystemOnly || bundle.FSOnlyImage(img) {
		return fs(inPlace)
	}
	return mem(dir, img, inPlace)
}

// BootInPlace is a filesystem-only restore of a sandbox whose bundle is
// still there (its rootfs keeps its writable layer): any container record
// a memory pause left goes, prepare readies the bundle in dir for a fresh
// boot, and start boots it.
func (b *Base) BootInPlace(ctx context.Context, id string, prepare, start func(dir string) error) error {
	dir := b.Bundles.Dir(id)
	if err := b.DeleteContainer(ctx, id); err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	if err := bundle.EnsureRootfs(dir); err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	if err := prepare(dir); err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	if err := start(dir); err != nil {
		_ = b.DeleteContainer(context.WithoutCancel(ctx), id)
		return fmt.Errorf("sandbox %s: boot: %w", id, err)
	}
	return nil
}

// Frozen is a sandbox a checkpoint froze (FreezeForDump).
type Frozen struct {
	b   *Base
	ctx context.Context
	id  string
	on  bool
}

// FreezeForDump freezes sandbox id when a checkpoint with opts needs it
// still: to copy its writable layer at the instant of the dump, or for a
// dump that leaves it running. Defer the result's Thaw; call Gone once
// the dump has stopped the sandbox's processes.
func (b *Base) FreezeForDump(ctx context.Context, id string, opts runtime.CheckpointOptions) (*Frozen, error) {
	f := &Frozen{b: b, ctx: context.WithoutCancel(ctx), id: id}
	if opts.UpperCopy == "" && !opts.LeaveRunning {
		return f, nil
	}
	if err := b.Freeze(ctx, id); err != nil {
		return nil, err
	}
	f.on = true
	return f, nil
}

// Gone says the sandbox's processes are gone: nothing is left to thaw.
func (f *Frozen) Gone() { f.on = false }

// Thaw thaws the sandbox if it is still frozen, joining a failure to *err.
func (f *Frozen) Thaw(err *error) {
	if !f.on {
		return
	}
	if terr := f.b.Thaw(f.ctx, f.id); terr != nil {
		*err = errors.Join(*err, terr)
	}
}

// DumpImage is where a checkpoint of sandbox id with opts writes its image
// (bundle.Store.ImageDir); own: it is the sandbox's own pause image. Defer
// drop: it removes that own image again when the checkpoint fails.
func (b *Base) DumpImage(id string, opts runtime.CheckpointOptions) (img string, own bool, drop func(err *error), err error) {
	img, own, err = b.Bundles.ImageDir(id, opts)
	if err != nil {
		return "", false, nil, err
	}
	return img, own, func(err *error) {
		if *err != nil && own {
			_ = os.RemoveAll(img)
		}
	}, nil
}

// BundleOf returns the bundle directory of a sandbox that has one, else
// errdefs.ErrNotFound.
func (b *Base) BundleOf(id string) (string, error) {
	if err := bundle.CheckID(id); err != nil {
		return "", err
	}
	dir := b.Bundles.Dir(id)
	if _, err := os.Stat(filepath.Join(dir, "config.json")); err != nil {
		return "", fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	return dir, nil
}
