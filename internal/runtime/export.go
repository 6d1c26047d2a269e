package runtime

import (
	"context"
	"fmt"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// PauseExporter copies a paused sandbox's pause image out, in the shape
// of a snapshot (memory image, writable layer and its log dir), so another
// server can restore it as a new sandbox (Restore with ImageDir).
type PauseExporter interface {
	// ExportPause copies the pause image of id to imageDir and its
	// writable layer to upperDir (and upperDir+".log"); neither may exist.
	// The sandbox stays paused and untouched.
	ExportPause(ctx context.Context, id, imageDir, upperDir string) error
}

var _ PauseExporter = (*Tiers)(nil)

// ExportPause asks the driver of the sandbox's tier.
func (ts *Tiers) ExportPause(ctx context.Context, id, imageDir, upperDir string) error {
	t := ts.driverOf(id)
	e, ok := t.Driver.(PauseExporter)
	if !ok {
		return fmt.Errorf("sandbox %s: the %s tier cannot export a pause image (only the container tier can): %w", id, t.Name, errdefs.ErrUnavailable)
	}
	return e.ExportPause(ctx, id, imageDir, upperDir)
}
