package sandbox

// DiskGuard refuses work that grows the server's disks while they are
// nearly full (diskspace.Guard), so the room left always suffices to record
// state and delete things. Admit returns an errdefs.ErrNoSpace naming the
// disk and what to free; Explain does the same for admitted work that
// found less room than it needed (its write failed with ENOSPC), and
// returns any other error as it is.
type DiskGuard interface {
	Admit(what string) error
	Explain(what string, err error) error
}

// admitDisk asks the disk guard, if any, whether what may grow a disk.
func (a *admission) admitDisk(what string) error {
	if a.disk == nil {
		return nil
	}
	return a.disk.Admit(what)
}

// diskFailed is err, the failure of what, as the client should read it:
// when a disk ran out of room, the disk guard's 507 naming the disk and
// what to free instead of the writer's own words (which are logged).
func (a *admission) diskFailed(what string, err error) error {
	if err == nil || a.disk == nil {
		return err
	}
	explained := a.disk.Explain(what, err)
	if explained != err && a.log != nil {
		a.log.Warn("a disk ran out of space", "op", what, "err", err)
	}
	return explained
}

// startWhat names a start path for the disk guard's messages.
func startWhat(path string) string {
	switch path {
	case "create":
		return "create a sandbox"
	case "restore":
		return "restore a snapshot"
	case "fork":
		return "fork a sandbox"
	case "build":
		return "run a template build step"
	case "resume", "resume-memory":
		return "resume a sandbox"
	default:
		return path + " a sandbox"
	}
}

// admitStart asks the disk guard about a start path. A resume is let
// through: it makes nothing new, and the owner gets back what is kept.
func (a *admission) admitStart(path string) error {
	switch path {
	case "resume", "resume-memory", "claim":
		return nil
	}
	return a.admitDisk(startWhat(path))
}
