package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
)

// Snapshotter takes, lists, deletes, forks and moves snapshots: it freezes
// a running sandbox for one instant, captures it into the snapshot store,
// starts a fork's copies (and a moved sandbox) through the start pipeline,
// and exports images for another server. Callers reach it through
// Manager.Snapshots. It reaches the records through recs and the
// catalogue (lookups, deletion, collection) through snaps.
type Snapshotter struct {
	cfg       Config // MaxTimeout, MaxCommandLifetime
	log       *slog.Logger
	inst      *instruments
	rt        runtime.Runtime
	templates Templates
	admission *admission
	envd      *envdLink
	store     func() *snapshotStore // nil store: snapshots are off
	snaps     *snapshots            // the catalogue (snapshot.go)
	recs      records
	start     *starter
	thaw      func(ctx context.Context, id string) error // undo an idle freeze
}

// baseLayers are the read-only layers sb runs on.
func (t *Snapshotter) baseLayers(ctx context.Context, sb *Sandbox) ([]string, error) {
	if sb.BaseSnapshot != "" {
		snap, err := t.store().load(sb.BaseSnapshot)
		if err != nil {
			return nil, err
		}
		return snap.Layers, nil
	}
	tpl, err := t.templates.Get(ctx, sb.TeamID, sb.TemplateID)
	if err != nil {
		return nil, fmt.Errorf("template %s of sandbox %s: %w", sb.TemplateID, sb.ID, err)
	}
	return tpl.Layers, nil
}

// snapshot captures sandbox id; memory false captures its files only.
func (t *Snapshotter) snapshot(ctx context.Context, teamID, id, name string, hidden, memory bool) (_ *Snapshot, err error) {
	if !hidden { // a fork's own checkpoint counts as part of the fork
		defer t.inst.observe(opName("snapshot", memory), time.Now(), &err)
	}
	// A fork's own snapshot crashes at its steps under the fork's name.
	crashAfter := func(step string) { t.inst.crashAfter("snapshot", step) }
	if hidden {
		crashAfter = func(step string) { t.inst.crashAfter("fork", forkStep(step)) }
	}
	snaps := t.store()
	if snaps == nil {
		return nil, fmt.Errorf("snapshots are not enabled on this server: %w", errdefs.ErrUnavailable)
	}
	if err := t.admission.admitDisk("snapshot a sandbox"); err != nil {
		return nil, err
	}
	defer func() { err = t.admission.diskFailed("snapshot a sandbox", err) }()
	ck, err := checkpointer(t.rt)
	if err != nil {
		return nil, err
	}
	ctx = context.WithoutCancel(ctx)
	if sb, err := t.recs.Get(ctx, teamID, id); err == nil && sb.State == StateKilling {
		return nil, conflict(id, StateKilling)
	}
	src, prev, err := t.recs.begin(ctx, teamID, id, StateSnapshotting, StateRunning)
	if err != nil {
		if errors.Is(err, errdefs.ErrConflict) {
			return nil, fmt.Errorf("%w; snapshots and forks are taken of running sandboxes (resume a paused one first)", err)
		}
		return nil, err
	}
	defer func() {
		if _, err := t.recs.commit(ctx, id, func(sb *Sandbox) { sb.State = prev.State }); err != nil {
			t.log.Error("persist state after snapshot", "sandbox", id, "err", err)
		}
		crashAfter(SnapshotCommitted)
		if err == nil && !hidden {
			t.inst.auditLifecycle(ctx, prev, "snapshot", "allowed", "", map[string]any{"memory": memory, "name": name})
		}
	}()
	crashAfter(SnapshotPersisted)
	layers, err := t.baseLayers(ctx, src)
	if err != nil {
		return nil, err
	}
	if err := t.thaw(ctx, id); err != nil {
		return nil, err
	}
	start := time.Now()
	snap := &Snapshot{
		ID: newSnapshotID(), Name: name, TeamID: src.TeamID, SandboxID: src.ID, TemplateID: src.TemplateID, Alias: src.Alias,
		CPUCount: src.CPUCount, MemoryMB: src.MemoryMB, DiskMB: src.DiskMB, PIDs: src.PIDs, TmpMB: src.TmpMB,
		Isolation: src.Isolation, VolumeMounts: slices.Clone(src.VolumeMounts), DefaultUser: src.DefaultUser,
		DefaultWorkdir: src.DefaultWorkdir, EnvVars: maps.Clone(src.EnvVars), Secure: src.Secure,
		AllowInternet: src.AllowInternet, Hidden: hidden, CreatedAt: time.Now().UTC(), FilesystemOnly: !memory,
		BootID: src.BootID,
	}
	if src.BaseSnapshot != "" {
		if base, err := snaps.load(src.BaseSnapshot); err == nil {
			snap.TemplateID = base.TemplateID
		}
	}
	snap.Layers = append(slices.Clone(layers), filepath.Join(snaps.path(snap.ID), "upper"))
	tmp := snaps.tmpPath(snap.ID)
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			_ = os.RemoveAll(tmp)
		}
	}()
	if err := ck.Checkpoint(ctx, id, runtime.CheckpointOptions{
		ImageDir: filepath.Join(tmp, "image"), LeaveRunning: true, UpperCopy: filepath.Join(tmp, "upper"), FilesystemOnly: !memory,
	}); err != nil {
		return nil, fmt.Errorf("sandbox %s: snapshot: %w", id, err)
	}
	crashAfter(SnapshotCaptured)
	if err := sealLayers(tmp); err != nil {
		return nil, fmt.Errorf("sandbox %s: snapshot: %w", id, err)
	}
	snap.SizeBytes = dirSize(tmp)
	b, _ := json.MarshalIndent(snap, "", "  ")
	if err := os.WriteFile(filepath.Join(tmp, snapshotMeta), b, 0o600); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, snaps.path(snap.ID)); err != nil {
		return nil, err
	}
	ok = true
	crashAfter(SnapshotPublished)
	t.log.Info("snapshot created", "sandbox", id, "snapshot", snap.ID, "name", name, "bytes", snap.SizeBytes, "took", time.Since(start).Round(time.Millisecond))
	return snap, nil
}

// Fork checkpoints the team's running sandbox once (it keeps running, same
// id and lifetime) and starts count copies of it, memory included, each
// with its own writable layer, network namespace, address and token.
func (t *Snapshotter) Fork(ctx context.Context, teamID, id string, count int, timeout time.Duration) (_ []ForkResult, err error) {
	defer t.inst.observe("fork", time.Now(), &err)
	if count < 1 || count > MaxForks {
		return nil, fmt.Errorf("count: must be from 1 to %d, got %d: %w", MaxForks, count, errdefs.ErrInvalidArgument)
	}
	if err := checkTimeout(t.cfg.MaxTimeout, timeout); err != nil {
		return nil, err
	}
	src, err := t.recs.Get(ctx, teamID, id)
	if err != nil {
		return nil, err
	}
	snap, err := t.snapshot(ctx, teamID, id, "", true, true)
	if err != nil {
		return nil, err
	}
	// Each copy is the source's twin: its team, key, env, metadata, egress
	// policy, tier, command cap and lifecycle; the memory image fixes the
	// limits.
	req := CreateRequest{
		TeamID: src.TeamID, APIKeyID: src.APIKeyID, Template: src.TemplateID, Timeout: timeout,
		Metadata: maps.Clone(src.Metadata), EnvVars: maps.Clone(src.EnvVars), Secure: src.Secure, AllowInternet: src.AllowInternet,
		Network: src.Network, Isolation: src.Isolation, MaxCommand: min(time.Duration(src.MaxCommandSeconds)*time.Second, t.cfg.MaxCommandLifetime),
		Lifecycle: LifecycleRequest{AutoPause: src.AutoPause, AutoPauseFS: src.AutoPauseFS, AutoResume: src.AutoResume, IdleTimeout: src.IdleTimeout},
	}
	out := make([]ForkResult, count)
	var wg sync.WaitGroup
	for i := range out {
		wg.Go(func() {
			// The fork slots (forkslots.go) pace the copies' restores.
			// Each copy is a new sandbox of the team (the pipeline's reserve
			// step): the copies past maxSandboxes fail on their own, the
			// others are made.
			b := newBuild("fork", req)
			b.snap, b.tplID = snap, src.TemplateID
			sb, err := t.start.run(ctx, restoreSnapshot(), b)
			out[i] = ForkResult{Sandbox: sb, Err: err}
		})
	}
	wg.Wait()
	t.forkDone(snap)
	t.inst.crashAfter("fork", ForkSnapshotReleased) // crash.go
	return out, nil
}

// reconcile removes, at start, what an operation the last server
// died in left half-made beyond the sandbox records Reconcile handles: the
// hidden snapshot of a fork the crash interrupted. No fork is in flight at
// start, so each is done: it goes now if no copy was made, else with its
// last copy.
func (t *Snapshotter) reconcile(ctx context.Context) {
	snaps := t.store()
	if snaps == nil {
		return
	}
	for _, s := range snaps.list(true) {
		if s.Hidden && !snaps.deleted(s.ID) {
			t.forkDone(s)
		}
	}
	t.snaps.gc(ctx, 0)
}

// forkDone marks a fork's own snapshot deleted once every copy is made or
// has failed: it is removed as soon as no copy runs on it, not after the
// minimum age that protects forks in flight, so killing the copies leaves
// nothing behind.
func (t *Snapshotter) forkDone(snap *Snapshot) {
	if err := os.WriteFile(filepath.Join(t.store().path(snap.ID), snapshotGone), nil, 0o600); err != nil {
		t.log.Warn("fork snapshot stays until its minimum age", "snapshot", snap.ID, "err", err)
	}
}

// ExportSnapshot copies the team's memory snapshot ref into dir in the
// shape ExportPaused writes (image/, upper/, upper.log/, base-N/), so
// another server starts a sandbox from it with ImportPaused. The snapshot
// stays here.
func (t *Snapshotter) ExportSnapshot(ctx context.Context, teamID, ref, dir string) (*MovedImage, error) {
	snaps := t.store()
	if snaps == nil {
		return nil, fmt.Errorf("snapshots are not enabled on this server: %w", errdefs.ErrUnavailable)
	}
	snap, ok := snaps.resolve(teamID, ref)
	if !ok || snap.Hidden {
		return nil, fmt.Errorf("snapshot %q: %w", ref, errdefs.ErrNotFound)
	}
	if snap.FilesystemOnly {
		return nil, fmt.Errorf("snapshot %s holds files only; only memory snapshots are exported: %w", snap.ID, errdefs.ErrInvalidArgument)
	}
	own := snaps.path(snap.ID)
	// The layers under its own upper that other snapshots captured (it was
	// taken of a sandbox that ran on a snapshot) travel along, lowest first.
	var extra []string
	for _, l := range snap.Layers[:max(len(snap.Layers)-1, 0)] {
		if rel, err := filepath.Rel(snaps.dir, l); err == nil && !strings.HasPrefix(rel, "..") {
			extra = append(extra, l)
		}
	}
	cp := func(src, dst string) error {
		if out, err := exec.CommandContext(ctx, "cp", "-a", "--reflink=auto", src, dst).CombinedOutput(); err != nil {
			return fmt.Errorf("snapshot %s: copy %s: %w: %s", snap.ID, src, err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	for i, l := range extra {
		if err := cp(l, filepath.Join(dir, fmt.Sprintf("base-%d", i))); err != nil {
			return nil, err
		}
	}
	for _, name := range []string{"image", "upper", "upper.log"} {
		src := filepath.Join(own, name)
		if _, err := os.Stat(src); err != nil {
			if name == "upper.log" {
				continue
			}
			return nil, fmt.Errorf("snapshot %s: %w", snap.ID, err)
		}
		if err := cp(src, filepath.Join(dir, name)); err != nil {
			return nil, err
		}
	}
	out := &MovedImage{BaseLayers: len(extra), Snapshot: *snap}
	out.Snapshot.Layers, out.Snapshot.VolumeMounts = nil, slices.Clone(snap.VolumeMounts)
	if snap.Secure {
		out.EnvdAuth = t.envd.token(snap.SandboxID)
	}
	return out, nil
}
