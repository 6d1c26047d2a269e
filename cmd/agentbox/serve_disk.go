package main

import "github.com/agentbox/agentbox/internal/diskspace"

// defaultDiskReserveMB is room for SQLite's journal and WAL, the audit log,
// runtime state of deletes and a checkpoint's bookkeeping, with margin.
const defaultDiskReserveMB = 256

// diskGuard guards the data and template disks (one guard, also when both
// are on the same filesystem). The messages name flags, never host paths:
// a refusal reaches API clients.
func (c *serveConfig) diskGuard() (*diskspace.Guard, error) {
	return diskspace.New(c.DiskReserveMB,
		diskspace.Disk{Name: "data disk (--data-dir)", Dir: c.DataDir,
			ToFree: "snapshots, paused sandboxes and volumes no longer needed"},
		diskspace.Disk{Name: "template disk (--template-dir)", Dir: c.TemplateDir,
			ToFree: "templates no longer used and their build uploads"})
}
