package runc

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// Each container-tier sandbox runs in an audit session of its own: runc is
// started through a shell that sets its login uid first, which gives it a
// new session id, inherited by the sandbox's init and everything after it,
// and which no process in the sandbox can change (that needs
// CAP_AUDIT_CONTROL in the host's user namespace). The kernel's seccomp
// records carry it, so a refusal by a process that exited before the
// server looked it up is still attributed (internal/seccomplog).

// sessionFile records the sandbox's audit session in its bundle.
const sessionFile = "audit-session"

// withSession runs bin with args in a new audit session whose login uid is
// the sandbox's mapped root. Where the kernel refuses (no audit, an
// immutable login uid), the command runs as before.
func (r *Runtime) withSession(cmd *exec.Cmd) {
	script := fmt.Sprintf(`echo %d > /proc/self/loginuid 2>/dev/null; exec "$@"`, r.cfg.UserNSBase)
	cmd.Args = append([]string{"/bin/sh", "-c", script, "agentbox-session"}, cmd.Args...)
	cmd.Path = "/bin/sh"
}

// recordSession stores the audit session of the sandbox whose init is pid.
func recordSession(dir string, pid int) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/sessionid")
	if err != nil {
		return
	}
	_ = os.WriteFile(filepath.Join(dir, sessionFile), b, 0o600)
}

// SandboxOfSession names the sandbox whose processes run in audit session
// ses. A session two bundles share (the kernel refused new sessions) names
// none.
func (r *Runtime) SandboxOfSession(ses uint32) (string, bool) {
	entries, err := os.ReadDir(r.cfg.StateDir)
	if err != nil {
		return "", false
	}
	want := strconv.FormatUint(uint64(ses), 10)
	found := ""
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(r.cfg.StateDir, e.Name(), sessionFile))
		if err != nil || strings.TrimSpace(string(b)) != want {
			continue
		}
		if found != "" {
			return "", false
		}
		found = e.Name()
	}
	return found, found != ""
}
