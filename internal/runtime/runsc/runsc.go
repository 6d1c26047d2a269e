package runc

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
)

// Isolation tiers this driver runs. Both take the same OCI bundle: runsc
// (gVisor) is a drop-in OCI runtime with a user-space kernel.
const (
	TierRunc  = "runc"
	TierRunsc = "runsc"
)

// tierFile records a sandbox's tier in its bundle, so Delete and State
// pick the right runtime also after a server restart.
const tierFile = "tier"

// RunscInstallHint tells an operator how to get the gVisor tier.
const RunscInstallHint = "install a static runsc (scripts/install-deps.sh does: CGO_ENABLED=0 GOFLAGS=-mod=mod go install -ldflags=\"-s -w\" gvisor.dev/gvisor/runsc@v0.0.0-20260905035102-160fafc42237, then copy it to /usr/local/bin) and restart the server"

// Tiers returns the registry entries of the tiers this driver runs: runc
// first (the default), then runsc, whose availability check says how to
// install it. Both entries are this driver today.
func (r *Runtime) Tiers() *runtime.Tiers { return r.tiers }

// newTiers registers the driver's tiers.
func (r *Runtime) newTiers() (*runtime.Tiers, error) {
	return runtime.NewTiers(
		runtime.Tier{Name: TierRunc, Driver: r},
		runtime.Tier{Name: TierRunsc, Driver: r, Available: func() error {
			if r.runscBin == "" {
				return fmt.Errorf("the gvisor tier needs runsc, which is not installed on this server: %s: %w", RunscInstallHint, errdefs.ErrUnavailable)
			}
			return nil
		}},
	)
}

// TierAvailable reports whether tier can run sandboxes here; the error says
// how to fix it when not.
func (r *Runtime) TierAvailable(tier string) error { return r.tiers.TierAvailable(tier) }

// tierOf returns the tier recorded in sandbox id's bundle (runc if none).
func (r *Runtime) tierOf(id string) string {
	b, err := os.ReadFile(filepath.Join(r.dir(id), tierFile))
	if err == nil && strings.TrimSpace(string(b)) == TierRunsc {
		return TierRunsc
	}
	return TierRunc
}

// runscArgs are runsc's global flags: systrap works without KVM; the
// sandbox's own netstack uses the prepared netns (runsc moves its
// addresses inside, so every sandbox needs a fresh netns, which it has);
// overlay2=none keeps writes on the host overlay, whose upper sits on the
// size-limited disk and is what the rest of the platform sees.
func (r *Runtime) runscArgs(logFile string) []string {
	args := []string{"--root", r.cfg.RunscRoot, "--platform=" + r.cfg.RunscPlatform, "--network=sandbox", "--overlay2=none"}
	if logFile != "" {
		args = append(args, "--log", logFile, "--log-format", "json")
	}
	return args
}

// oci runs one OCI runtime command for sandbox id on its tier.
func (r *Runtime) oci(ctx context.Context, id, logFile string, args ...string) ([]byte, error) {
	if r.tierOf(id) != TierRunsc {
		return r.runc(ctx, logFile, args...)
	}
	return r.runsc(ctx, logFile, args...)
}

// runsc runs a runsc command; stdio is handled as in runc.
func (r *Runtime) runsc(ctx context.Context, logFile string, args ...string) ([]byte, error) {
	if r.runscBin == "" {
		return nil, fmt.Errorf("runsc is not installed: %w", errdefs.ErrUnavailable)
	}
	cmd := exec.CommandContext(ctx, r.runscBin, append(r.runscArgs(logFile), args...)...)
	var stdout, stderr bytes.Buffer
	// A restored sandbox inherits stdio like a run one.
	if args[0] != "run" && args[0] != "restore" {
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
	}
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if logFile != "" {
			msg = lastRunscError(logFile)
		}
		return nil, fmt.Errorf("runsc %s: %w: %s", args[0], err, msg)
	}
	return stdout.Bytes(), nil
}

// lastRunscError returns the last warning or error of a runsc JSON log.
func lastRunscError(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	var msg, last string
	for line := range bytes.SplitSeq(b, []byte("\n")) {
		var e struct {
			Level string `json:"level"`
			Msg   string `json:"msg"`
		}
		if json.Unmarshal(line, &e) == nil && e.Msg != "" {
			last = e.Msg
			if e.Level == "error" || e.Level == "warning" {
				msg = e.Msg
			}
		}
	}
	if msg == "" {
		// runsc often fails without an error line; its last words help.
		msg = last
	}
	return msg
}

// runscList returns the ids of runsc's containers.
func (r *Runtime) runscList(ctx context.Context) ([]string, error) {
	if r.runscBin == "" {
		return nil, nil
	}
	if _, err := os.Stat(r.cfg.RunscRoot); err != nil {
		return nil, nil
	}
	out, err := r.runsc(ctx, "", "list", "--quiet")
	if err != nil {
		return nil, err
	}
	return strings.Fields(string(out)), nil
}
