package microvm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/runtime/bundle"
)

var (
	_ runtime.Checkpointer     = (*Driver)(nil)
	_ runtime.CheckpointProber = (*Driver)(nil)
)

// A pause image: the VM's state as QEMU migrated it to a file (RAM and
// devices), beside the writable disk it goes with; or, for a
// filesystem-only pause, only the marker.
const (
	imageDir     = "pause"
	memoryFile   = "memory.img"
	completeFile = "complete"
	fsOnlyFile   = "fs-only"
)

// CheckpointSupported: a VM that runs can always be saved by its QEMU.
func (d *Driver) CheckpointSupported() error { return d.available() }

// Freeze stops the guest's CPUs; its memory stays in QEMU.
func (d *Driver) Freeze(ctx context.Context, id string) error { return d.monitor(ctx, id, "stop") }

// Thaw resumes the guest's CPUs.
func (d *Driver) Thaw(ctx context.Context, id string) error { return d.monitor(ctx, id, "cont") }

func (d *Driver) monitor(ctx context.Context, id, cmd string) error {
	if err := bundle.CheckID(id); err != nil {
		return err
	}
	if _, err := d.pid(id); err != nil {
		return fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	q, err := d.dialQMP(ctx, id)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	defer q.Close()
	if _, err := q.run(cmd, nil); err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	return nil
}

// Checkpoint saves the VM to its pause image and stops QEMU: the guest's
// RAM and device state through QEMU's migration to a file (passed to QEMU
// as a descriptor: its sandbox may not open files), the disk as it is.
// With an ImageDir (a snapshot or fork) it saves there instead and copies
// the writable disk to UpperCopy while the guest is stopped.
func (d *Driver) Checkpoint(ctx context.Context, id string, opts runtime.CheckpointOptions) error {
	if err := bundle.CheckID(id); err != nil {
		return err
	}
	if opts.ImageDir != "" {
		return d.snapshot(ctx, id, opts)
	}
	if opts.LeaveRunning || opts.UpperCopy != "" {
		return fmt.Errorf("sandbox %s: a checkpoint that leaves the VM running needs an ImageDir: %w", id, errdefs.ErrInvalidArgument)
	}
	img := filepath.Join(d.dir(id), imageDir)
	if err := os.RemoveAll(img); err != nil {
		return err
	}
	if err := os.Mkdir(img, 0o700); err != nil {
		return err
	}
	if opts.FilesystemOnly {
		// The guest's unflushed writes may be lost, as on a crash.
		if err := d.kill(ctx, id); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(img, fsOnlyFile), nil, 0o600); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(img, completeFile), nil, 0o600)
	}
	if err := d.saveMemory(ctx, id, filepath.Join(img, memoryFile)); err != nil {
		_ = d.Thaw(context.WithoutCancel(ctx), id)
		return fmt.Errorf("sandbox %s: save VM: %w", id, err)
	}
	if err := d.kill(ctx, id); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(img, completeFile), nil, 0o600)
}

// saveMemory stops the guest and migrates its state into path.
func (d *Driver) saveMemory(ctx context.Context, id, path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	q, err := d.dialQMP(ctx, id)
	if err != nil {
		return err
	}
	defer q.Close()
	if _, err := q.run("stop", nil); err != nil {
		return err
	}
	if err := q.sendFD("agentbox-migrate", f); err != nil {
		return err
	}
	if _, err := q.run("migrate", map[string]any{"uri": "fd:agentbox-migrate"}); err != nil {
		return err
	}
	for {
		r, err := q.run("query-migrate", nil)
		if err != nil {
			return err
		}
		var st struct {
			Status    string `json:"status"`
			ErrorDesc string `json:"error-desc"`
		}
		if err := json.Unmarshal(r, &st); err != nil {
			return err
		}
		switch st.Status {
		case "completed":
			return f.Sync()
		case "failed", "cancelled":
			return fmt.Errorf("migration %s: %s", st.Status, st.ErrorDesc)
		}
		select {
		case <-ctx.Done():
			_, _ = q.run("migrate_cancel", nil)
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// sendFD hands QEMU a descriptor under name (QMP getfd with SCM_RIGHTS).
func (q *qmp) sendFD(name string, f *os.File) error {
	uc, ok := q.c.(*net.UnixConn)
	if !ok {
		return errors.New("qemu monitor is not a unix socket")
	}
	b, _ := json.Marshal(map[string]any{"execute": "getfd", "arguments": map[string]any{"fdname": name}})
	if _, _, err := uc.WriteMsgUnix(append(b, '\n'), unix.UnixRights(int(f.Fd())), nil); err != nil {
		return fmt.Errorf("qemu getfd: %w", err)
	}
	_, err := q.read("getfd")
	return err
}

// Restore starts sandbox spec.ID again from its pause image, in place.
func (d *Driver) Restore(ctx context.Context, spec runtime.Spec, opts runtime.RestoreOptions) error {
	if err := bundle.CheckID(spec.ID); err != nil {
		return err
	}
	p := d.probe()
	if p.err != nil {
		return fmt.Errorf("sandbox %s: %w", spec.ID, p.err)
	}
	if opts.ImageDir != "" {
		return d.restoreNew(ctx, spec, opts, p)
	}
	img := filepath.Join(d.dir(spec.ID), imageDir)
	if _, err := os.Stat(filepath.Join(img, completeFile)); err != nil {
		return fmt.Errorf("sandbox %s: no pause image: %w", spec.ID, errdefs.ErrNotFound)
	}
	if _, err := d.pid(spec.ID); err == nil {
		return fmt.Errorf("sandbox %s is running: %w", spec.ID, errdefs.ErrConflict)
	}
	// In place: the VM is the one Create made, on the same root and
	// netns, whatever the resume request carries.
	var created runtime.Spec
	b, err := os.ReadFile(filepath.Join(d.dir(spec.ID), specFile))
	if err == nil {
		err = json.Unmarshal(b, &created)
	}
	if err != nil {
		return fmt.Errorf("sandbox %s: the spec it was created with: %w", spec.ID, err)
	}
	spec.Layers, spec.Resources = created.Layers, created.Resources
	if spec.NetNSPath == "" {
		spec.NetNSPath = created.NetNSPath
	}
	root, err := d.rootImage(ctx, spec.ID, spec.Layers)
	if err != nil {
		return err
	}
	if d.cfg.Net != nil {
		if err := d.cfg.Net.Plug(ctx, spec.ID, 0); err != nil {
			return err
		}
	}
	mac, _, _, _, err := guestNet(spec.NetNSPath)
	if err != nil {
		return fmt.Errorf("sandbox %s: network: %w", spec.ID, err)
	}
	_, err = d.startFrom(ctx, spec, p, root, mac, img, opts.FilesystemOnly)
	return err
}

// startFrom starts spec's QEMU from image directory img: with the guest's
// memory, which it resumes, unless fsOnly or the image has the disk only
// (then the guest boots afresh). resumed reports the former.
func (d *Driver) startFrom(ctx context.Context, spec runtime.Spec, p probe, root, mac, img string, fsOnly bool) (resumed bool, err error) {
	if _, err := os.Stat(filepath.Join(img, fsOnlyFile)); fsOnly || err == nil {
		return false, d.start(ctx, spec, p, root, mac, nil)
	}
	f, err := os.Open(filepath.Join(img, memoryFile))
	if err != nil {
		return false, err
	}
	defer f.Close()
	// The image is QEMU's descriptor 3.
	if err := d.start(ctx, spec, p, root, mac, []string{"-incoming", "fd:3"}, f); err != nil {
		return false, err
	}
	return true, d.resumeIncoming(ctx, spec.ID)
}

// resumeIncoming waits until QEMU has loaded the image, then runs the
// guest (the source was stopped, so it arrives paused).
func (d *Driver) resumeIncoming(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	for {
		st, err := d.qmpStatus(ctx, id)
		if err != nil {
			return fmt.Errorf("sandbox %s: restore: %w", id, err)
		}
		switch st {
		case "inmigrate":
		case "running":
			return nil
		case "paused", "prelaunch":
			return d.Thaw(ctx, id)
		default:
			return fmt.Errorf("sandbox %s: restore: the VM is %s", id, st)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("sandbox %s: restore: %w", id, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// HasCheckpoint reports whether a complete pause image of id exists.
func (d *Driver) HasCheckpoint(ctx context.Context, id string) (bool, error) {
	if err := bundle.CheckID(id); err != nil {
		return false, err
	}
	_, err := os.Stat(filepath.Join(d.dir(id), imageDir, completeFile))
	return err == nil, nil
}

// DropCheckpoint removes id's pause image.
func (d *Driver) DropCheckpoint(ctx context.Context, id string) error {
	if err := bundle.CheckID(id); err != nil {
		return err
	}
	return os.RemoveAll(filepath.Join(d.dir(id), imageDir))
}

// snapshot saves the VM (memory unless FilesystemOnly) into opts.ImageDir
// and copies its writable disk into opts.UpperCopy while the guest is
// stopped, so memory and disk match; the VM then runs on (LeaveRunning) or
// stops.
func (d *Driver) snapshot(ctx context.Context, id string, opts runtime.CheckpointOptions) (err error) {
	if _, err := d.pid(id); err != nil {
		return fmt.Errorf("sandbox %s is not running: %w", id, errdefs.ErrConflict)
	}
	if opts.UpperCopy == "" {
		return fmt.Errorf("sandbox %s: a microvm snapshot needs UpperCopy for its disk: %w", id, errdefs.ErrInvalidArgument)
	}
	if err := os.MkdirAll(opts.ImageDir, 0o700); err != nil {
		return err
	}
	if err := os.MkdirAll(opts.UpperCopy, 0o700); err != nil {
		return err
	}
	if opts.FilesystemOnly {
		// Stopping the CPUs drains QEMU's block layer to the disk file;
		// the guest's own unflushed writes may be lost, as on a crash.
		err = d.Freeze(ctx, id)
	} else {
		err = d.saveMemory(ctx, id, filepath.Join(opts.ImageDir, memoryFile))
	}
	if err == nil {
		err = copyDisk(ctx, filepath.Join(d.dir(id), diskFile), filepath.Join(opts.UpperCopy, diskFile))
	}
	if opts.LeaveRunning || err != nil {
		// A VM that migrated out runs again after cont, on its own disk.
		if terr := d.Thaw(context.WithoutCancel(ctx), id); terr != nil && err == nil {
			err = terr
		}
	} else if err == nil {
		err = d.kill(ctx, id)
	}
	if err != nil {
		return fmt.Errorf("sandbox %s: snapshot: %w", id, err)
	}
	if opts.FilesystemOnly {
		if err := os.WriteFile(filepath.Join(opts.ImageDir, fsOnlyFile), nil, 0o600); err != nil {
			return err
		}
	}
	return os.WriteFile(filepath.Join(opts.ImageDir, completeFile), nil, 0o600)
}

// restoreNew starts a new sandbox from a snapshot: spec.Layers end with
// the snapshot's disk directory (earlier ones of a snapshot of a snapshot
// are skipped: each disk copy holds all the writes before it); the rest
// make the root image. The guest takes over the new sandbox's address.
func (d *Driver) restoreNew(ctx context.Context, spec runtime.Spec, opts runtime.RestoreOptions, p probe) (err error) {
	if len(spec.Layers) < 2 {
		return fmt.Errorf("sandbox %s: spec.Layers: a template root and the snapshot's disk are required: %w", spec.ID, errdefs.ErrInvalidArgument)
	}
	rootLayers, upper := snapshotLayers(spec.Layers)
	if len(rootLayers) == 0 || upper == "" {
		return fmt.Errorf("sandbox %s: spec.Layers: %q has no template root or no snapshot disk last: %w", spec.ID, spec.Layers, errdefs.ErrInvalidArgument)
	}
	if _, err := os.Stat(filepath.Join(opts.ImageDir, completeFile)); err != nil {
		return fmt.Errorf("sandbox %s: incomplete image %s: %w", spec.ID, opts.ImageDir, errdefs.ErrNotFound)
	}
	spec.Layers = rootLayers
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
	disk := filepath.Join(dir, diskFile)
	if err := copyDisk(ctx, filepath.Join(upper, diskFile), disk); err != nil {
		return fmt.Errorf("sandbox %s: %w", spec.ID, err)
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
	gc := guestConfig(spec, addr, gw)
	// Only a copy that boots fresh reads its settings from the disk. A
	// memory image still has the disk's filesystem mounted in the guest:
	// editing it behind the guest's back would race its cached blocks, so
	// that guest takes its settings from renumber's frames instead.
	if _, err := os.Stat(filepath.Join(opts.ImageDir, fsOnlyFile)); opts.FilesystemOnly || err == nil {
		if err := d.writeSeed(ctx, spec.ID, disk, gc); err != nil {
			return fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
	}
	resumed, err := d.startFrom(ctx, spec, p, root, mac, opts.ImageDir, opts.FilesystemOnly)
	if err != nil || !resumed {
		return err
	}
	if err := renumber(ctx, spec.NetNSPath, mac, gc.Addr, gc.Gateway); err != nil {
		return fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	return nil
}

// snapshotLayers splits a snapshot's layers into the template's (the
// root image's) and the directory of the disk to start from (the last;
// "" if the last holds none). Earlier disk directories, of the snapshots
// a snapshot was taken from, are dropped: every disk copy is whole.
func snapshotLayers(layers []string) (root []string, disk string) {
	for i, l := range layers {
		if _, err := os.Stat(filepath.Join(l, diskFile)); err == nil {
			if i == len(layers)-1 {
				disk = l
			}
			continue
		}
		root = append(root, l)
	}
	return root, disk
}
