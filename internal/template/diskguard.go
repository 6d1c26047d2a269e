package template

import "errors"

// DiskGuard refuses work that grows the server's disks while they are
// nearly full (diskspace.Guard); Admit returns an errdefs.ErrNoSpace naming
// the disk and what to free. Explain does the same for admitted work whose
// writes ran out of room, and returns any other error as it is.
type DiskGuard interface {
	Admit(what string) error
	Explain(what string, err error) error
}

// SetDiskGuard makes every build and upload ask g first. Call before
// serving.
func (s *Store) SetDiskGuard(g DiskGuard) { s.disk = g }

func (s *Store) admitDisk(what string) error {
	if s.disk == nil {
		return nil
	}
	return s.disk.Admit(what)
}

// explainDisk is err, the failure of what, as the client should read it:
// the disk guard's ErrNoSpace naming the disk when a disk ran out of room.
// A build command's own failure is the tenant's, whatever its text says.
func (s *Store) explainDisk(what string, err error) error {
	var exit *ExitError
	if err == nil || s.disk == nil || errors.As(err, &exit) {
		return err
	}
	explained := s.disk.Explain(what, err)
	if explained != err {
		s.log.Warn("a disk ran out of space", "op", what, "err", err)
	}
	return explained
}
