// Package seccomplog turns the kernel's seccomp audit records (type 1326,
// emitted for filters installed with SECCOMP_FILTER_FLAG_LOG) into audit
// events of the sandbox whose process made the refused call.
//
// Records are read from the audit netlink socket's read-only multicast group
// (AUDIT_NLGRP_READLOG). That needs neither auditd nor the audit daemon
// role, coexists with an auditd and with other agentbox servers on the host,
// and, unlike /dev/kmsg, is not cut by the kernel's printk rate limit (ten
// lines per five seconds for the whole host).
package seccomplog

import (
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// auditSeccomp is AUDIT_SECCOMP, the record type of a logged seccomp action.
const auditSeccomp = 1326

// Architectures in records (AUDIT_ARCH_*).
const (
	archX86_64 = 0xc000003e
	archI386   = 0x40000003
	x32Bit     = 0x40000000 // x32 calls arrive as x86_64 with this bit set
)

// Seccomp return actions (SECCOMP_RET_*) in a record's code field.
const (
	retActionFull = 0xffff0000
	retKillProc   = 0x80000000
	retKillThread = 0x00000000
	retTrap       = 0x00030000
	retErrno      = 0x00050000
	retTrace      = 0x7ff00000
	retLog        = 0x7ffc0000
	retData       = 0x0000ffff
)

// Record is one parsed seccomp audit record.
type Record struct {
	PID     int    // in the host's PID namespace
	Comm    string // attacker-controlled: the process names itself
	Exe     string // path inside the process's mount namespace
	Arch    uint32
	Syscall int
	Code    uint32 // the filter's return value
	Session uint32 // audit session (ses=); SessionUnset when none
}

// SessionUnset is the audit session of a process nobody gave one.
const SessionUnset = 4294967295

// Action names what the filter did: "errno", "kill", "trap", ...
func (r Record) Action() string {
	switch r.Code & retActionFull {
	case retErrno:
		return "errno"
	case retKillProc, retKillThread:
		return "kill"
	case retTrap:
		return "trap"
	case retTrace:
		return "trace"
	case retLog:
		return "log"
	}
	return fmt.Sprintf("0x%x", r.Code&retActionFull)
}

// Errno is the error number the call failed with (errno action only).
func (r Record) Errno() int {
	if r.Code&retActionFull != retErrno {
		return 0
	}
	return int(r.Code & retData)
}

// errNotSeccomp marks a well-formed record of another kind.
var errNotSeccomp = errors.New("not a seccomp record")

// ParseRecord parses the text of a type 1326 record as the kernel sends it
// on the audit socket ("audit(1795319214.993:7): auid=... pid=4200
// comm=\"spike\" exe=\"/tmp/spike\" sig=0 arch=c000003e syscall=321 ...").
// The kernel quotes a string value only when it holds no space, quote or
// control byte and hex-encodes it otherwise, so splitting on spaces is safe
// whatever a process calls itself.
func ParseRecord(text string) (Record, error) {
	r := Record{Session: SessionUnset}
	text = strings.TrimRight(text, "\x00\n")
	if _, rest, ok := strings.Cut(text, "): "); ok && strings.HasPrefix(text, "audit(") {
		text = rest
	}
	var have struct{ pid, arch, syscall, code bool }
	for _, f := range strings.Fields(text) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			continue
		}
		var err error
		switch k {
		case "pid":
			r.PID, err = strconv.Atoi(v)
			have.pid = true
		case "comm":
			r.Comm, err = untrusted(v)
		case "exe":
			r.Exe, err = untrusted(v)
		case "arch":
			var a uint64
			a, err = strconv.ParseUint(v, 16, 32)
			r.Arch, have.arch = uint32(a), true
		case "syscall":
			r.Syscall, err = strconv.Atoi(v)
			have.syscall = true
		case "ses":
			var s uint64
			s, err = strconv.ParseUint(v, 10, 32)
			r.Session = uint32(s)
		case "code":
			var c uint64
			c, err = strconv.ParseUint(strings.TrimPrefix(v, "0x"), 16, 32)
			r.Code, have.code = uint32(c), true
		}
		if err != nil {
			return Record{}, fmt.Errorf("seccomp record: %s: %w", k, err)
		}
	}
	if !have.pid || !have.arch || !have.syscall || !have.code {
		return Record{}, fmt.Errorf("seccomp record %q: missing pid, arch, syscall or code", truncate(text, 200))
	}
	return r, nil
}

// untrusted decodes an audit string value: "quoted", hex, or (null).
func untrusted(v string) (string, error) {
	switch {
	case v == "(null)":
		return "", nil
	case len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"':
		return v[1 : len(v)-1], nil
	}
	b, err := hex.DecodeString(v)
	if err != nil {
		return "", fmt.Errorf("neither quoted nor hex: %w", err)
	}
	return string(b), nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
