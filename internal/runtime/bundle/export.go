package bundle

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// ExportImage copies the sandbox's pause image to dst with the record of
// the uid range it was taken in (the restore recreates that range), but
// holds no range: the copy leaves this host.
func (s *Store) ExportImage(ctx context.Context, id, dst string) error {
	if err := CheckID(id); err != nil {
		return err
	}
	dir := s.Dir(id)
	img := filepath.Join(dir, CheckpointDir)
	if _, err := os.Stat(img); err != nil {
		return fmt.Errorf("sandbox %s: no pause image: %w", id, err)
	}
	if err := copyTree(ctx, img, dst); err != nil {
		return fmt.Errorf("sandbox %s: export pause image: %w", id, err)
	}
	if base, ok := BundleRange(dir); ok {
		if err := os.WriteFile(filepath.Join(dst, imageRangeFile), []byte(strconv.FormatUint(uint64(base), 10)+"\n"), 0o600); err != nil {
			return fmt.Errorf("sandbox %s: export pause image: %w", id, err)
		}
	}
	return nil
}
