package envd

import (
	"crypto/rand"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// bootIDPath is where programs read the id of the boot they run in
// (systemd, journald, tools that tell one boot from the next).
const bootIDPath = "/proc/sys/kernel/random/boot_id"

// bootIDSource holds this boot's id. It lives on the sandbox's own /dev
// tmpfs, as runc's masks of /proc files do (/dev/null over /proc/kcore),
// so a memory checkpoint restores the mount and its id with the sandbox.
const bootIDSource = "/dev/.agentbox-boot_id"

// OwnBootID gives the sandbox a boot id of its own, fresh at every boot
// (create, files-only resume) and kept across a memory pause, instead of
// the host's: sandboxes must not tell that they share a host, or learn
// its boot. It bind-mounts a new random UUID over bootIDPath, read-only.
// It needs CAP_SYS_ADMIN in the sandbox's user namespace (init, before
// DropSysAdmin); without it the error says so and the host's id stays.
func OwnBootID() error {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return err
	}
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // RFC 4122 variant
	id := fmt.Sprintf("%x-%x-%x-%x-%x\n", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
	if err := os.WriteFile(bootIDSource, []byte(id), 0o444); err != nil {
		return fmt.Errorf("boot id: %w", err)
	}
	if err := unix.Mount(bootIDSource, bootIDPath, "", unix.MS_BIND, ""); err != nil {
		os.Remove(bootIDSource)
		return fmt.Errorf("boot id: bind over %s: %w", bootIDPath, err)
	}
	if err := unix.Mount("", bootIDPath, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		return fmt.Errorf("boot id: read-only: %w", err)
	}
	return nil
}
