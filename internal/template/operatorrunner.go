package template

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// OperatorRunner runs the commands of the operator's builtin definitions
// (apt-get installs from the configured Debian mirror and the builtin
// scripts in BuiltinDefinitions: the operator's input, not a tenant's)
// chrooted into an overlay of the step's layers, in private mount and PID
// namespaces, with the host's network (the mirror). It is what `agentbox
// template build <builtin>` uses without a running server; every build a
// team asks for runs its steps as sandboxes through the server's runner.
// It has none of a sandbox's limits or isolation, so it refuses a request
// made for a team: a team's input never runs here.
type OperatorRunner struct{}

// RunSteps implements StepRunner.
func (OperatorRunner) RunSteps(ctx context.Context, req StepRequest) error {
	if req.TeamID != "" {
		return fmt.Errorf("build %s of team %s: the operator's runner runs only the operator's builtin definitions; a team's steps run as its sandboxes through the server: %w",
			req.BuildID, req.TeamID, errdefs.ErrInvalidArgument)
	}
	work, err := os.MkdirTemp(filepath.Dir(req.UpperDir), ".step-")
	if err != nil {
		return err
	}
	defer removeTree(work)
	if err := os.Mkdir(req.UpperDir, 0o755); err != nil {
		return err
	}
	merged, unmount, err := mountOverlay(work, req.Layers, req.UpperDir)
	if err != nil {
		return err
	}
	defer unmount()
	for _, c := range req.Commands {
		if c.User != "" && c.User != "root" && c.User != "0" {
			return fmt.Errorf("line %d: operator builds run commands as root, not %q", c.Line, c.User)
		}
		env := []string{"HOME=/root", "LANG=C.UTF-8", "PATH=" + defaultPath}
		for _, k := range slices.Sorted(maps.Keys(c.Env)) {
			env = append(env, k+"="+c.Env[k])
		}
		wd := c.Workdir
		if wd == "" {
			wd = "/"
		}
		// /proc and /dev exist only in the command's own mount namespace.
		script := `mount -t proc proc "$1/proc" && mount --rbind /dev "$1/dev" && exec chroot "$1" /bin/sh -c 'cd "$0" && exec /bin/sh -c "$1"' "$2" "$3"`
		cmd := exec.CommandContext(ctx, "unshare", "--mount", "--pid", "--fork", "--propagation", "private",
			"/bin/sh", "-c", script, "sh", merged, wd, c.Cmd)
		cmd.Env = env
		cmd.Stdout, cmd.Stderr = req.Output, req.Output
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("line %d: %q: %w", c.Line, strings.TrimSpace(c.Cmd), err)
		}
	}
	return nil
}
