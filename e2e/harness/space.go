package harness

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// DefaultMinFreeMB is the free space the harness wants on the disks of a
// server's data dir and template cache before it starts one: a server's
// sandboxes, images and builds grow them, and a disk that fills while many
// suites run fails them all in ways that hide the cause.
// $AGENTBOX_E2E_MIN_FREE_MB sets another margin (0: no check).
const DefaultMinFreeMB = 3072

// minFreeMB is the margin in force.
func minFreeMB() (uint64, error) {
	v := os.Getenv("AGENTBOX_E2E_MIN_FREE_MB")
	if v == "" {
		return DefaultMinFreeMB, nil
	}
	n, err := strconv.ParseUint(v, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("AGENTBOX_E2E_MIN_FREE_MB=%q: want a number of MiB (0 turns the check off)", v)
	}
	return n, nil
}

// checkFreeSpace refuses when a disk holding one of dirs has less than
// minMB MiB available.
func checkFreeSpace(minMB uint64, dirs map[string]string) error {
	if minMB == 0 {
		return nil
	}
	for what, dir := range dirs {
		var st unix.Statfs_t
		if err := unix.Statfs(dir, &st); err != nil {
			return fmt.Errorf("free space of %s %s: %w", what, dir, err)
		}
		// Available, not free: a disk whose reserved blocks are all that
		// is left is full for this purpose.
		free := st.Bavail * uint64(st.Frsize) >> 20
		if free < minMB {
			return fmt.Errorf("not starting a server: the disk of %s %s has %d MiB available, under the harness's margin of %d MiB; free space (finished runs' /tmp/agentbox-e2e-* data dirs, old template builds) or set AGENTBOX_E2E_MIN_FREE_MB",
				what, dir, free, minMB)
		}
	}
	return nil
}
