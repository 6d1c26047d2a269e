package harness

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// DataDiskMB puts the server's data dir on a filesystem of its own of mb
// MiB (a tmpfs), so a test can fill it without filling the host's disk.
// The template store stays on the shared cache.
func DataDiskMB(mb int) Option { return func(c *config) { c.dataDiskMB = mb } }

// mountDataDisk mounts the data dir's own filesystem when asked.
func (s *Server) mountDataDisk() error {
	if s.cfg.dataDiskMB <= 0 {
		return nil
	}
	if err := os.MkdirAll(s.DataDir, 0o700); err != nil {
		return err
	}
	opts := fmt.Sprintf("size=%dm,mode=0700", s.cfg.dataDiskMB)
	if err := syscall.Mount("tmpfs", s.DataDir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount a %d MiB tmpfs on %s: %w", s.cfg.dataDiskMB, s.DataDir, err)
	}
	return nil
}

// unmountDataDisk undoes mountDataDisk once nothing of the server's is
// mounted below it.
func (s *Server) unmountDataDisk() error {
	if s.cfg.dataDiskMB <= 0 {
		return nil
	}
	if err := syscall.Unmount(s.DataDir, 0); err != nil && !errors.Is(err, syscall.EINVAL) {
		return fmt.Errorf("unmount the data disk %s: %w", s.DataDir, err)
	}
	return nil
}
