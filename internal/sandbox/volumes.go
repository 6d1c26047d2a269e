package sandbox

import (
	"context"
	"fmt"
	"slices"

	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/volume"
)

// VolumeMount is a team volume mounted in a sandbox. A create names the
// volume (Name); the record keeps its ID too, so snapshots and forks mount
// the very volume even if the name is given to another one later.
type VolumeMount struct {
	ID   string `json:"id,omitempty"`
	Name string `json:"name"`
	Path string `json:"path"`
}

// Volumes is what the manager needs of team volumes (internal/volume).
type Volumes interface {
	// Claim resolves the team's volumes by name or id, mounts them on the
	// host and holds them against deletion until release.
	Claim(ctx context.Context, teamID string, refs []string, byID bool) ([]volume.Mounted, func(), error)
}

// VolumeUsers returns the team's sandboxes that mount volume id, in any
// state (a paused sandbox's mount stays in its bundle).
func (m *Manager) VolumeUsers(teamID, id string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, sb := range m.sandboxes {
		if sb.TeamID != teamID {
			continue
		}
		if slices.ContainsFunc(sb.VolumeMounts, func(v VolumeMount) bool { return v.ID == id }) {
			out = append(out, sb.ID)
		}
	}
	slices.Sort(out)
	return out
}

// claimVolumes resolves mounts for b (by name from a create, by id from a
// snapshot), holds the volumes until the build ends and records them on
// the sandbox and for the runtime.
func (s *starter) claimVolumes(ctx context.Context, b *build, mounts []VolumeMount, byID bool) error {
	if len(mounts) == 0 {
		return nil
	}
	if s.vols == nil {
		return fmt.Errorf("volumeMounts: this server has no volumes: %w", errdefs.ErrInvalidArgument)
	}
	refs := make([]string, len(mounts))
	for i, v := range mounts {
		refs[i] = v.Name
		if byID {
			refs[i] = v.ID
		}
	}
	claimed, release, err := s.vols.Claim(ctx, b.sb.TeamID, refs, byID)
	if err != nil {
		if byID {
			return fmt.Errorf("a volume the snapshot's sandbox mounted is gone: %w", err)
		}
		return fmt.Errorf("volumeMounts: %w", err)
	}
	b.release = append(b.release, release)
	b.sb.VolumeMounts = make([]VolumeMount, len(claimed))
	b.volumes = make([]runtime.VolumeMount, len(claimed))
	for i, c := range claimed {
		b.sb.VolumeMounts[i] = VolumeMount{ID: c.ID, Name: c.Name, Path: mounts[i].Path}
		b.volumes[i] = runtime.VolumeMount{Source: c.HostPath, Path: mounts[i].Path}
		s.inst.record(ctx, audit.Event{SandboxID: b.sb.ID, TeamID: b.sb.TeamID, APIKeyID: b.sb.APIKeyID, Kind: audit.KindLifecycle,
			Action: "volume-mount", Fields: map[string]any{"volumeID": c.ID, "name": c.Name, "path": mounts[i].Path}})
	}
	return nil
}
