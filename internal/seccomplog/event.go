package seccomplog

import (
	"fmt"
	"strings"

	"github.com/agentbox/agentbox/internal/audit"
)

// Event renders d as the sandbox's audit event (team and key left empty).
func (d Denial) Event() audit.Event {
	e := audit.Event{Time: d.First, SandboxID: d.SandboxID, Kind: audit.KindSyscall,
		Decision: audit.Denied, Fields: map[string]any{"count": d.Count}}
	if d.Overflow {
		e.Action = "other"
		e.Reason = fmt.Sprintf("%d more refused calls of further syscalls in the same second, not itemized", d.Count)
		e.Fields["overflow"] = true
		return e
	}
	name := d.Syscall
	if name == "" {
		name = "unknown"
	}
	// The action is the syscall's name: what an agent filters and reads.
	e.Action = name
	e.Fields["seccomp"] = d.Action
	e.Fields["nr"] = d.Nr
	e.Fields["arch"] = d.Arch
	e.Fields["hostPid"] = d.PID
	if d.SandboxPID > 0 {
		e.Fields["pid"] = d.SandboxPID
	}
	e.Fields["comm"] = d.Comm
	if d.Exe != "" {
		e.Fields["exe"] = d.Exe
	}
	if d.Errno > 0 {
		e.Fields["errno"] = d.Errno
	}

	var b strings.Builder
	fmt.Fprintf(&b, "syscall %s(%d)", name, d.Nr)
	if d.Arch != "x86_64" {
		fmt.Fprintf(&b, " [%s]", d.Arch)
	}
	switch d.Action {
	case "kill":
		b.WriteString(" killed the process under")
	case "trap":
		b.WriteString(" trapped by")
	default:
		b.WriteString(" refused by")
	}
	// A number the policy does not refuse came from a filter the process
	// installed itself; say so rather than blame the policy.
	if d.Syscall != "" && d.Reason != "" {
		fmt.Fprintf(&b, " the sandbox's seccomp policy (%s)", d.Reason)
	} else {
		b.WriteString(" a seccomp filter (the sandbox's policy, or one the process installed)")
	}
	pid := d.SandboxPID
	if pid == 0 {
		pid = d.PID
	}
	// comm is chosen by the process: quoted so it cannot pose as more text.
	fmt.Fprintf(&b, "; pid %d comm %q", pid, d.Comm)
	if d.Count > 1 {
		fmt.Fprintf(&b, "; %d times in this second", d.Count)
	}
	e.Reason = b.String()
	return e
}
