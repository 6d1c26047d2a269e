package microvm

import (
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// QEMU drops to a host uid (and gid) of its own once it has opened its
// devices and monitor (its disks come as descriptors, so it never opens
// them by path): a QEMU escape is then an unprivileged user that owns
// nothing, not root, and not the uid of another sandbox's QEMU. The uids
// are above the container tier's user-namespace ranges; a lock file per
// uid, on a tmpfs shared by every server instance of the host (forgotten
// at reboot, with the QEMUs), keeps two sandboxes off one uid.
const (
	qemuUIDBase  = 0x70000000
	qemuUIDCount = 1 << 16
	uidLockDir   = "/run/agentbox-microvm-uids"
	uidFile      = "uid"
)

// allocUID reserves a uid for sandbox id and records it in its state dir.
func (d *Driver) allocUID(id string) (int, error) {
	if err := os.MkdirAll(uidLockDir, 0o700); err != nil {
		return 0, err
	}
	h := fnv.New32a()
	h.Write([]byte(d.keys.Key(id)))
	start := int(h.Sum32() % qemuUIDCount)
	for i := range qemuUIDCount {
		uid := qemuUIDBase + (start+i)%qemuUIDCount
		lock := filepath.Join(uidLockDir, strconv.Itoa(uid))
		f, err := os.OpenFile(lock, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if errors.Is(err, os.ErrExist) {
			continue
		}
		if err != nil {
			return 0, err
		}
		f.Close()
		if err := os.WriteFile(filepath.Join(d.dir(id), uidFile), []byte(strconv.Itoa(uid)), 0o600); err != nil {
			_ = os.Remove(lock)
			return 0, err
		}
		return uid, nil
	}
	return 0, fmt.Errorf("no free QEMU uid in %d..%d", qemuUIDBase, qemuUIDBase+qemuUIDCount-1)
}

// sandboxUID returns the uid reserved for id, reserving one if it has none.
func (d *Driver) sandboxUID(id string) (int, error) {
	b, err := os.ReadFile(filepath.Join(d.dir(id), uidFile))
	if err != nil {
		return d.allocUID(id)
	}
	uid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || uid < qemuUIDBase || uid >= qemuUIDBase+qemuUIDCount {
		return 0, fmt.Errorf("sandbox %s: bad uid record %q", id, b)
	}
	// Held again after a reboot emptied the lock dir.
	if err := os.MkdirAll(uidLockDir, 0o700); err == nil {
		if f, err := os.OpenFile(filepath.Join(uidLockDir, strconv.Itoa(uid)), os.O_CREATE|os.O_WRONLY, 0o600); err == nil {
			f.Close()
		}
	}
	return uid, nil
}

// releaseUID frees the uid of a deleted sandbox.
func (d *Driver) releaseUID(id string) {
	b, err := os.ReadFile(filepath.Join(d.dir(id), uidFile))
	if err != nil {
		return
	}
	if uid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && uid >= qemuUIDBase && uid < qemuUIDBase+qemuUIDCount {
		_ = os.Remove(filepath.Join(uidLockDir, strconv.Itoa(uid)))
	}
}
