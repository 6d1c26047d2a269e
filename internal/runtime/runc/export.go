package runc

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime/bundle"
)

// ExportPause copies the sandbox's pause image and writable layer out, as
// a snapshot holds them (runtime.PauseExporter).
func (d *Driver) ExportPause(ctx context.Context, id, imageDir, upperDir string) error {
	if err := bundle.CheckID(id); err != nil {
		return err
	}
	img := filepath.Join(d.b.Dir(id), bundle.CheckpointDir)
	if _, err := os.Stat(filepath.Join(img, criuInventory)); err != nil && !bundle.FSOnlyImage(img) {
		return fmt.Errorf("sandbox %s has no complete pause image: %w", id, errdefs.ErrNotFound)
	}
	if err := d.b.ExportImage(ctx, id, imageDir); err != nil {
		return err
	}
	return d.b.CaptureUpper(ctx, id, upperDir)
}
