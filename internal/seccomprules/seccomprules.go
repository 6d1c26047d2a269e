// Package seccomprules holds the argument-dependent refusals of the
// container tier's seccomp policy, shared by the runtime, which puts them in
// the OCI profile, and envd, which stacks a logging copy of the policy (see
// internal/envd/auditfilter_linux.go): both must refuse exactly the same
// calls with the same errors.
package seccomprules

import "golang.org/x/sys/unix"

// NamespaceCloneFlags are refused in clone(2): a new namespace is an
// escape surface (user namespaces above all), and the sandbox already has
// its own.
func NamespaceCloneFlags() []uint64 {
	return []uint64{
		unix.CLONE_NEWNS, unix.CLONE_NEWCGROUP, unix.CLONE_NEWUTS, unix.CLONE_NEWIPC,
		unix.CLONE_NEWUSER, unix.CLONE_NEWPID, unix.CLONE_NEWNET, unix.CLONE_NEWTIME,
	}
}

// IPProtoMPTCP is IPPROTO_MPTCP, the third argument of socket(2), refused
// with EPROTONOSUPPORT: MPTCP sockets bypass Landlock's TCP rules and
// cannot be checkpointed.
const IPProtoMPTCP = 262

// TIOCSTI, the second argument of ioctl(2), is refused with EPERM: it
// pushes bytes into another process's terminal input.
const TIOCSTI = unix.TIOCSTI
