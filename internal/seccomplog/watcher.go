package seccomplog

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/seccomprules"
)

// auditNLGrpReadlog is AUDIT_NLGRP_READLOG, the multicast group that gets a
// copy of every audit record (needs CAP_AUDIT_READ).
const auditNLGrpReadlog = 1

// maxKeysPerSandbox bounds the events one sandbox can cause per window. A
// process may install its own logging filter and make records for any
// syscall number; past this many distinct syscalls, the rest is one
// summary event.
const maxKeysPerSandbox = 16

// Denial is what one sandbox had refused, of one syscall, in one window.
type Denial struct {
	SandboxID  string
	Syscall    string // name; "" when the number is not one the policy refuses
	Nr         int
	Arch       string // x86_64, i386 or x32
	Action     string // errno, kill or trap
	Errno      int
	Reason     string // why the policy refuses it (Config.Explain)
	PID        int    // host PID of the first caller in the window
	SandboxPID int    // its PID inside the sandbox; 0 when unknown
	Comm       string // attacker-controlled
	Exe        string
	Count      int       // refusals in the window; the first caller's details stand for all
	First      time.Time // when the first was read
	Overflow   bool      // a summary of the calls past maxKeysPerSandbox distinct syscalls
}

// Config configures a Watcher.
type Config struct {
	// CgroupParent is the server's cgroup parent: a sandbox's processes
	// live in /<CgroupParent>/<name>. Required.
	CgroupParent string
	// ByCgroup names the sandbox whose cgroup directory is name (the
	// runtime names them by an opaque key); nil: name is the sandbox id.
	ByCgroup func(name string) (sandboxID string, ok bool)
	// Sink receives each aggregated denial. Required.
	Sink func(context.Context, Denial)
	// Explain says why the policy refuses a syscall name ("" for unknown).
	Explain func(name string) string
	// Window is the aggregation period; default one second.
	Window time.Duration
	// ProcRoot is where /proc is; tests change it.
	ProcRoot string
	// BySession names the sandbox of an audit session, for records whose
	// process exited before it could be looked up by pid (optional).
	BySession func(ses uint32) (sandboxID string, ok bool)
}

// Watcher reads seccomp records and reports the sandboxes' denials.
type Watcher struct {
	cfg Config
	fd  int
	log *slog.Logger
}

// Open subscribes to the kernel's audit records. It fails where the kernel
// has no audit support or the caller lacks CAP_AUDIT_READ; the server then
// runs without syscall auditing.
func Open(cfg Config, log *slog.Logger) (*Watcher, error) {
	if cfg.CgroupParent == "" || cfg.Sink == nil {
		return nil, errors.New("seccomplog: CgroupParent and Sink are required")
	}
	if cfg.Window <= 0 {
		cfg.Window = time.Second
	}
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	if cfg.Explain == nil {
		cfg.Explain = func(string) string { return "" }
	}
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_AUDIT)
	if err != nil {
		return nil, fmt.Errorf("seccomplog: audit socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: auditNLGrpReadlog}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("seccomplog: join audit log group: %w", err)
	}
	// A burst of refusals must fit while the reader catches up.
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 4<<20)
	// The timeout paces the flushes when no record arrives.
	tv := unix.NsecToTimeval((cfg.Window / 4).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("seccomplog: receive timeout: %w", err)
	}
	return &Watcher{cfg: cfg, fd: fd, log: log.With("component", "seccomplog")}, nil
}

// Run reads records until ctx ends, then closes the socket.
func (w *Watcher) Run(ctx context.Context) {
	defer unix.Close(w.fd)
	agg := newAggregator(w.cfg)
	buf := make([]byte, 1<<16)
	next := time.Now().Add(w.cfg.Window)
	lost := 0
	for ctx.Err() == nil {
		n, _, err := unix.Recvfrom(w.fd, buf, 0)
		switch {
		case err == nil:
			for _, text := range seccompMessages(buf[:n]) {
				r, err := ParseRecord(text)
				if err != nil {
					w.log.Debug("unreadable seccomp record", "err", err)
					continue
				}
				if !agg.add(r, time.Now()) {
					w.log.Debug("seccomp record of no sandbox of this server", "pid", r.PID, "syscall", r.Syscall)
				}
			}
		case errors.Is(err, unix.ENOBUFS):
			lost++ // the kernel dropped records: the socket buffer overflowed
		case errors.Is(err, unix.EAGAIN), errors.Is(err, unix.EINTR):
		default:
			w.log.Error("audit socket read failed; syscall denials are no longer audited", "err", err)
			return
		}
		if now := time.Now(); !now.Before(next) {
			if lost > 0 {
				w.log.Warn("seccomp records lost to a full socket buffer; counts are low", "overflows", lost)
				lost = 0
			}
			for _, d := range agg.flush() {
				w.cfg.Sink(ctx, d)
			}
			next = now.Add(w.cfg.Window)
		}
	}
}

// seccompMessages returns the text of the seccomp records in a netlink
// datagram. Audit messages are not padded to the netlink alignment that
// syscall.ParseNetlinkMessage insists on, so the header is read by hand.
func seccompMessages(b []byte) []string {
	var out []string
	for len(b) >= unix.NLMSG_HDRLEN {
		l := int(binary.NativeEndian.Uint32(b[0:4]))
		typ := binary.NativeEndian.Uint16(b[4:6])
		if l < unix.NLMSG_HDRLEN || l > len(b) {
			l = len(b)
		}
		if typ == auditSeccomp {
			out = append(out, string(b[unix.NLMSG_HDRLEN:l]))
		}
		l = (l + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1)
		if l >= len(b) {
			break
		}
		b = b[l:]
	}
	return out
}

// who is a caller attributed to a sandbox.
type who struct {
	sandbox    string
	sandboxPID int
}

type aggKey struct {
	sandbox string
	arch    uint32
	nr      int
	action  string
}

// aggregator folds records into one Denial per sandbox, syscall and window.
type aggregator struct {
	cfg     Config
	pids    map[int]who // cleared every window: PIDs get reused
	pending map[aggKey]*Denial
	keys    map[string]int // distinct keys per sandbox this window
	others  map[string]*Denial
}

func newAggregator(cfg Config) *aggregator {
	a := &aggregator{cfg: cfg}
	a.reset()
	return a
}

func (a *aggregator) reset() {
	a.pids, a.pending, a.keys, a.others = map[int]who{}, map[aggKey]*Denial{}, map[string]int{}, map[string]*Denial{}
}

// add counts r; false when r is not a refusal by one of this server's
// sandboxes (another server's, a host process's, or one that exited before
// it could be attributed).
func (a *aggregator) add(r Record, now time.Time) bool {
	action := r.Action()
	if action != "errno" && action != "kill" && action != "trap" {
		return false // SECCOMP_RET_LOG and friends allow the call
	}
	caller, ok := a.pids[r.PID]
	if !ok {
		caller, ok = attribute(a.cfg.ProcRoot, a.cfg.CgroupParent, r.PID)
		if ok && a.cfg.ByCgroup != nil {
			caller.sandbox, ok = a.cfg.ByCgroup(caller.sandbox)
		}
		if !ok && r.Session != SessionUnset && a.cfg.BySession != nil {
			// Exited already: every sandbox has an audit session of its
			// own, which its processes cannot change.
			var id string
			if id, ok = a.cfg.BySession(r.Session); ok {
				caller = who{sandbox: id}
			}
		}
		if !ok {
			return false
		}
		a.pids[r.PID] = caller
	}
	k := aggKey{sandbox: caller.sandbox, arch: r.Arch, nr: r.Syscall, action: action}
	if d := a.pending[k]; d != nil {
		d.Count++
		return true
	}
	if a.keys[k.sandbox] >= maxKeysPerSandbox {
		o := a.others[k.sandbox]
		if o == nil {
			o = &Denial{SandboxID: k.sandbox, First: now, Overflow: true}
			a.others[k.sandbox] = o
		}
		o.Count++
		return true
	}
	a.keys[k.sandbox]++
	arch, name := archName(r.Arch, r.Syscall)
	a.pending[k] = &Denial{
		SandboxID: caller.sandbox, Syscall: name, Nr: r.Syscall, Arch: arch, Action: action, Errno: r.Errno(),
		Reason: a.cfg.Explain(name), PID: r.PID, SandboxPID: caller.sandboxPID, Comm: r.Comm, Exe: r.Exe,
		Count: 1, First: now,
	}
	return true
}

// flush returns the window's denials in the order they first happened.
func (a *aggregator) flush() []Denial {
	out := make([]Denial, 0, len(a.pending)+len(a.others))
	for _, d := range a.pending {
		out = append(out, *d)
	}
	for _, d := range a.others {
		out = append(out, *d)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].First.Before(out[j].First) })
	a.reset()
	return out
}

// archName names a record's architecture and, for x86_64, its syscall.
func archName(arch uint32, nr int) (string, string) {
	switch {
	case arch == archX86_64 && nr&x32Bit != 0:
		return "x32", ""
	case arch == archX86_64:
		return "x86_64", seccomprules.SyscallName(nr)
	case arch == archI386:
		return "i386", ""
	}
	return fmt.Sprintf("0x%x", arch), ""
}

// attribute finds the sandbox of a host PID from its cgroup, which runc put
// at /<parent>/<sandbox id> (every hierarchy on cgroup v1, the one on v2).
func attribute(procRoot, parent string, pid int) (who, bool) {
	dir := filepath.Join(procRoot, strconv.Itoa(pid))
	b, err := os.ReadFile(filepath.Join(dir, "cgroup"))
	if err != nil {
		return who{}, false // exited already: nothing left to attribute it by
	}
	id := sandboxOfCgroup(string(b), parent)
	if id == "" {
		return who{}, false
	}
	return who{sandbox: id, sandboxPID: nsPID(filepath.Join(dir, "status"))}, true
}

// sandboxOfCgroup returns the sandbox id in a /proc/<pid>/cgroup text.
func sandboxOfCgroup(text, parent string) string {
	prefix := "/" + strings.Trim(parent, "/") + "/"
	for _, line := range strings.Split(text, "\n") {
		// hierarchy-ID:controllers:path; the path may hold colons.
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		rest, ok := strings.CutPrefix(parts[2], prefix)
		if !ok {
			continue
		}
		if id, _, _ := strings.Cut(rest, "/"); id != "" {
			return id
		}
	}
	return ""
}

// nsPID reads the innermost PID from a /proc/<pid>/status file: the one the
// process has inside the sandbox.
func nsPID(statusPath string) int {
	f, err := os.Open(statusPath)
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "NSpid:"); ok {
			fs := strings.Fields(rest)
			if len(fs) == 0 {
				return 0
			}
			n, _ := strconv.Atoi(fs[len(fs)-1])
			return n
		}
	}
	return 0
}
