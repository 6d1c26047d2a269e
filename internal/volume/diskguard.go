package volume

// DiskGuard refuses work that grows the server's disks while they are
// nearly full (diskspace.Guard); Admit returns an errdefs.ErrNoSpace naming
// the disk and what to free. Volume images are sparse: a write into one
// takes host disk, so writes through the content API ask too (a full host
// disk under a sparse image fails the volume's filesystem with I/O errors,
// not a clean ENOSPC).
type DiskGuard interface {
	Admit(what string) error
}

// SetDiskGuard makes volume creates and content API writes ask g first.
// Call before serving.
func (s *Service) SetDiskGuard(g DiskGuard) { s.disk = g }

func (s *Service) admitDisk(what string) error {
	if s.disk == nil {
		return nil
	}
	return s.disk.Admit(what)
}

func (f *Files) admitDisk() error {
	if f.disk == nil {
		return nil
	}
	return f.disk.Admit("write to a volume")
}
