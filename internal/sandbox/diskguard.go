package sandbox

// DiskGuard refuses work that grows the server's disks while they are
// nearly full (diskspace.Guard), so the room left always suffices to record
// state and delete things. Admit returns an errdefs.ErrNoSpace naming the
// disk and what to free.
type DiskGuard interface {
	Admit(what string) error
}

// admitDisk asks the disk guard, if any, whether what may grow a disk.
func (a *admission) admitDisk(what string) error {
	if a.disk == nil {
		return nil
	}
	return a.disk.Admit(what)
}

// admitStart asks the disk guard about a start path. A resume is let
// through: it makes nothing new, and the owner gets back what is kept.
func (a *admission) admitStart(path string) error {
	what := ""
	switch path {
	case "resume", "claim":
		return nil
	case "create":
		what = "create a sandbox"
	case "restore":
		what = "restore a snapshot"
	case "fork":
		what = "fork a sandbox"
	case "build":
		what = "run a template build step"
	default:
		what = path + " a sandbox"
	}
	return a.admitDisk(what)
}
