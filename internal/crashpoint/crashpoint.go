// Package crashpoint kills the server right after a named step of an
// operation that changes state, so the crash-safety tests can check what
// the next start finds after a crash at exactly that point.
//
// The switch is the hidden serve flag --test-crash-after; it is never read
// from the environment or a config file, so a production server cannot be
// crashed by a variable in its environment.
package crashpoint

import (
	"log/slog"
	"os"
	"strings"
	"syscall"
)

// Switch is the point to crash at, as "<operation>/<step>" (e.g.
// "create/persist creating"). The zero Switch never crashes.
type Switch struct {
	at  string
	log *slog.Logger
}

// New returns the switch for at ("" never crashes).
func New(at string, log *slog.Logger) Switch {
	return Switch{at: strings.TrimSpace(at), log: log}
}

// Armed reports whether a crash point is set.
func (s Switch) Armed() bool { return s.at != "" }

// Matches reports whether op/step is the configured point. The older form
// "op:step" is accepted too.
func (s Switch) Matches(op, step string) bool {
	return s.at != "" && (s.at == op+"/"+step || s.at == op+":"+step)
}

// After kills the process with SIGKILL when op/step is the configured
// point: no deferred call, rollback or shutdown hook runs, as in a real
// crash.
func (s Switch) After(op, step string) {
	if !s.Matches(op, step) {
		return
	}
	if s.log != nil {
		s.log.Warn("test crash point: killing the server", "operation", op, "step", step)
	}
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way; do not run the next step
}
