package template

// DiskGuard refuses work that grows the server's disks while they are
// nearly full (diskspace.Guard); Admit returns an errdefs.ErrNoSpace naming
// the disk and what to free.
type DiskGuard interface {
	Admit(what string) error
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
