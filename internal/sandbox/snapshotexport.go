package sandbox

import "context"

// ExportSnapshot copies the team's memory snapshot ref into dir in the
// shape ExportPaused writes (image/, upper/, upper.log/, base-N/), so
// another server starts a sandbox from it with ImportPaused. The snapshot
// stays here.
func (m *Manager) ExportSnapshot(ctx context.Context, teamID, ref, dir string) (*MovedImage, error) {
	return m.snapshotter.export(ctx, teamID, ref, dir)
}
