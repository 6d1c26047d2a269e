package sandbox

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// ExportSnapshot copies the team's memory snapshot ref into dir in the
// shape ExportPaused writes (image/, upper/, upper.log/, base-N/), so
// another server starts a sandbox from it with ImportPaused. The snapshot
// stays here.
func (m *Manager) ExportSnapshot(ctx context.Context, teamID, ref, dir string) (*MovedImage, error) {
	snaps := m.life.snaps
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
		out.EnvdAuth = m.envd.token(snap.SandboxID)
	}
	return out, nil
}
