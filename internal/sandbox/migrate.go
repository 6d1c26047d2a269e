package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
)

// MovedImage is what a paused sandbox's restore on another server needs
// besides its files: the record of the snapshot it becomes there.
type MovedImage struct {
	Snapshot Snapshot `json:"snapshot"`
	// EnvdAuth is the token the restored envd holds (a secure sandbox's),
	// which authorises its re-/init on the new server.
	EnvdAuth string `json:"envdAuth,omitempty"`
	// BaseLayers counts the captured layers under the writable one
	// (base-0 lowest) that the sandbox ran on besides its template's.
	BaseLayers int `json:"baseLayers,omitempty"`
}

// ExportPaused copies the team's sandbox, paused with its memory, into dir
// in the shape of a snapshot (image/, upper/, upper.log/), for another
// server to restore with ImportPaused. The sandbox stays paused here.
func (t *Snapshotter) ExportPaused(ctx context.Context, teamID, id, dir string) (*MovedImage, error) {
	ex, ok := t.rt.(runtime.PauseExporter)
	if !ok {
		return nil, fmt.Errorf("this runtime cannot export paused sandboxes: %w", errdefs.ErrUnavailable)
	}
	src, err := t.recs.Get(ctx, teamID, id)
	switch {
	case err != nil:
		return nil, err
	case src.State != StatePaused || src.PausedFS:
		return nil, fmt.Errorf("sandbox %s is %s, not paused with its memory: %w", id, src.State, errdefs.ErrConflict)
	}
	// A sandbox restored from a snapshot (a fork, a moved one) runs on its
	// snapshot's captured layers too: they travel along, lowest first.
	var extra []string
	tplID := src.TemplateID
	if src.BaseSnapshot != "" {
		base, err := t.store().load(src.BaseSnapshot)
		if err != nil {
			return nil, fmt.Errorf("sandbox %s: base snapshot: %w", id, err)
		}
		tplID = base.TemplateID
		for _, l := range base.Layers {
			if rel, err := filepath.Rel(t.store().dir, l); err == nil && !strings.HasPrefix(rel, "..") {
				extra = append(extra, l)
			}
		}
	}
	for i, l := range extra {
		if out, err := exec.CommandContext(ctx, "cp", "-a", "--reflink=auto", l, filepath.Join(dir, fmt.Sprintf("base-%d", i))).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("sandbox %s: copy base layer %s: %w: %s", id, l, err, strings.TrimSpace(string(out)))
		}
	}
	t.inst.crashAfter(OpMoveOut, MoveLayersCopied)
	if err := ex.ExportPause(ctx, id, filepath.Join(dir, "image"), filepath.Join(dir, "upper")); err != nil {
		return nil, err
	}
	t.inst.crashAfter(OpMoveOut, MoveImageOut)
	out := &MovedImage{BaseLayers: len(extra), Snapshot: Snapshot{
		TeamID: src.TeamID, SandboxID: src.ID, TemplateID: tplID, Alias: src.Alias,
		CPUCount: src.CPUCount, MemoryMB: src.MemoryMB, DiskMB: src.DiskMB, PIDs: src.PIDs, TmpMB: src.TmpMB,
		Isolation: src.Isolation, VolumeMounts: slices.Clone(src.VolumeMounts), DefaultUser: src.DefaultUser,
		DefaultWorkdir: src.DefaultWorkdir, EnvVars: maps.Clone(src.EnvVars), Secure: src.Secure,
		AllowInternet: src.AllowInternet, CreatedAt: time.Now().UTC(), BootID: src.BootID,
	}}
	if src.Secure {
		out.EnvdAuth = t.envd.token(src.ID)
	}
	return out, nil
}

// ImportPaused restores, as a sandbox of req.TeamID (a new address, memory
// and files as they were), a paused sandbox that another server exported:
// under req.ID when set (the moved sandbox keeps its id, so clients that
// hold it reach it), else under a new id. fill writes the exported tree into the empty dir it is
// given (download, verify, unpack) and returns its record; on any error
// nothing is left behind. The tree becomes a hidden snapshot of the team
// that lives as long as the sandbox, as a fork's does.
func (t *Snapshotter) ImportPaused(ctx context.Context, req CreateRequest, fill func(dir string) (*MovedImage, error)) (_ *Sandbox, err error) {
	snaps := t.store()
	if snaps == nil {
		return nil, fmt.Errorf("snapshots are not enabled on this server: %w", errdefs.ErrUnavailable)
	}
	if _, err := checkpointer(t.rt); err != nil {
		return nil, err
	}
	sid := newSnapshotID()
	tmp := snaps.tmpPath(sid)
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return nil, err
	}
	final := snaps.path(sid)
	defer func() {
		if err != nil {
			_ = os.RemoveAll(tmp)
			_ = os.RemoveAll(final)
		}
	}()
	img, err := fill(tmp)
	if err != nil {
		return nil, err
	}
	if err := sealLayers(tmp); err != nil {
		return nil, err
	}
	t.inst.crashAfter(OpMoveIn, MoveImageFetched)
	snap := img.Snapshot
	if snap.FilesystemOnly || !ValidID(snap.SandboxID) {
		return nil, fmt.Errorf("moved image of sandbox %q: not a memory image: %w", snap.SandboxID, errdefs.ErrInvalidArgument)
	}
	// After fill: an image that fails its check is refused as such, not
	// for the id it claims.
	if req.ID != "" {
		if err := t.recs.checkChosenID(req.ID); err != nil {
			return nil, err
		}
	}
	// The writable layer was captured over the template's layers: the same
	// template (by id, else by alias) must be here.
	tpl, err := t.templates.Get(ctx, req.TeamID, snap.TemplateID)
	if err != nil && snap.Alias != "" {
		tpl, err = t.templates.Get(ctx, req.TeamID, snap.Alias)
	}
	if err != nil {
		return nil, fmt.Errorf("moved image of sandbox %s: template %s (%s) is not on this server: %w", snap.SandboxID, snap.TemplateID, snap.Alias, err)
	}
	if tpl.ID != snap.TemplateID {
		t.log.Warn("moved image restores on another build of its template", "sandbox", snap.SandboxID, "template", snap.TemplateID, "here", tpl.ID)
	}
	snap.ID, snap.Name, snap.TeamID, snap.Hidden = sid, "", req.TeamID, true
	snap.TemplateID, snap.CreatedAt = tpl.ID, time.Now().UTC()
	if img.BaseLayers < 0 || img.BaseLayers > 64 {
		return nil, fmt.Errorf("moved image of sandbox %s: %d base layers: %w", snap.SandboxID, img.BaseLayers, errdefs.ErrInvalidArgument)
	}
	snap.Layers = slices.Clone(tpl.Layers)
	for i := range img.BaseLayers {
		snap.Layers = append(snap.Layers, filepath.Join(final, fmt.Sprintf("base-%d", i)))
	}
	snap.Layers = append(snap.Layers, filepath.Join(final, "upper"))
	snap.SizeBytes = dirSize(tmp)
	b, _ := json.MarshalIndent(&snap, "", "  ")
	if err := os.WriteFile(filepath.Join(tmp, snapshotMeta), b, 0o600); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, final); err != nil {
		return nil, err
	}
	t.inst.crashAfter(OpMoveIn, MoveImagePlaced)
	req.Template = tpl.ID
	bd := newBuild("restore", req)
	bd.snap, bd.tplID = &snap, tpl.ID
	p := restoreSnapshot().swap(StepResolve, "moved image", func(s *starter, ctx context.Context, b *build) error {
		if err := s.resolveSnapshot(ctx, b); err != nil {
			return err
		}
		if snap.Secure {
			b.envdAuth = img.EnvdAuth // the token the image's envd holds
		}
		return nil
	})
	sb, err := t.start.run(ctx, p, bd)
	if err == nil {
		// The snapshot is this sandbox's alone: it goes as soon as the
		// sandbox stops using it, not after the minimum age that protects
		// snapshots forks are made from.
		t.forkDone(&snap)
	}
	return sb, err
}
