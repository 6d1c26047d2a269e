// Package nsjoin lets a hidden subcommand of the agentbox binary run inside
// another process's user or mount namespace, as `runc init` does: a C
// constructor runs before the Go runtime starts its threads and calls
// setns(2), which the kernel refuses for either to a multi-threaded process.
// The hooks on the create path (boot-id with its inotify caps, and hold)
// and those of every resume and fork (userns-limits, plug-wait) finish in the
// constructor and never start the Go runtime: one fork and exec each,
// without the milliseconds a Go runtime start and the binary's package
// initialisation cost.
//
// The C, in nsjoin.c, is each of these hooks' only implementation. It
// acts only on the exact command lines the server makes (`<binary> __hook
// <name> --pid <pid> ...`, `__hook plug-wait --socket <path>`, `__hook
// hold`); anything else reaches the hook's Go side, which names what is
// wrong (internal/runtime/runc's Run*Hook). Import it for its side effect
// from the main package and from tests whose binary stands in for it.
package nsjoin

/*
#cgo CFLAGS: -Wall -Werror
int agentbox_ns_joined(void);
int agentbox_ns_limited(void);
*/
import "C"

// Joined reports whether this process joined the namespace of its hook's
// --pid before the Go runtime started. The hook cannot check that by
// comparing /proc/<pid>/ns/user with its own: once inside, it may no longer
// read the links of a process the host's user namespace made (runc init is
// not dumpable while it sets the namespaces up).
func Joined() bool { return C.agentbox_ns_joined() != 0 }

// Limited reports whether the boot-id hook set the inotify caps of its
// --pid's user namespace (or found it to be the host's, which it leaves
// alone) before the Go runtime started.
func Limited() bool { return C.agentbox_ns_limited() != 0 }
