package envd

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// SetNonDumpable makes the calling process non-dumpable. Sandbox root has
// no CAP_SYS_PTRACE, so for a non-dumpable envd the kernel refuses it
// ptrace attach, process_vm_readv and /proc/<pid>/{mem,environ,maps,fd}:
// the access token, the processes' pipes and the /init settings in envd's
// memory cannot be read or rewritten from inside. The flag belongs to the
// address space (every thread shares it) and execve resets it, so each envd
// process (init, server, interpreter) sets it first thing. CRIU, which
// runs as host root, checkpoints and restores it.
func SetNonDumpable() error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl(PR_SET_DUMPABLE, 0): %w", err)
	}
	return nil
}

// Dumpable reports the calling process's dumpable flag.
func Dumpable() (bool, error) {
	v, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0)
	if err != nil {
		return false, fmt.Errorf("prctl(PR_GET_DUMPABLE): %w", err)
	}
	return v != 0, nil
}
