package bundle

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/agentbox/agentbox/internal/runtime"
)

// Each container-tier sandbox runs in an audit session of its own: runc is
// forked from a thread that set its own login uid first (inSession in
// internal/runtime/runc), which gives it a new session id, inherited by the sandbox's init and everything after it,
// and which no process in the sandbox can change (that needs
// CAP_AUDIT_CONTROL in the host's user namespace). The kernel's seccomp
// records carry it, so a refusal by a process that exited before the
// server looked it up is still attributed (internal/seccomplog).

// sessionFile records the sandbox's audit session in its bundle.
const sessionFile = "audit-session"

// RecordSession stores the audit session of the sandbox whose init is pid.
func RecordSession(dir string, pid int) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/sessionid")
	if err != nil {
		return
	}
	_ = os.WriteFile(filepath.Join(dir, sessionFile), b, 0o600)
}

// SandboxOfSession names the sandbox whose processes run in audit session
// ses. A session two bundles share (the kernel refused new sessions) names
// none.
func (s *Store) SandboxOfSession(ses uint32) (string, bool) {
	entries, err := os.ReadDir(s.cfg.StateDir)
	if err != nil {
		return "", false
	}
	want := strconv.FormatUint(uint64(ses), 10)
	found := ""
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(s.cfg.StateDir, e.Name(), sessionFile))
		if err != nil || strings.TrimSpace(string(b)) != want {
			continue
		}
		id, ok := s.bundleID(e.Name())
		if !ok {
			continue
		}
		if found != "" {
			return "", false
		}
		found = id
	}
	return found, found != ""
}

var _ runtime.SandboxResolver = (*Store)(nil)
