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
)

// OperatorRunner runs the commands of the operator's builtin definitions
// (apt-get installs from the configured Debian mirror and the builtin
// scripts in BuiltinDefinitions: the operator's input, not a tenant's)
// chrooted into an overlay of the step's layers, in private mount and PID
// namespaces, with the host's network (the mirror). It is what `agentbox
// template build <builtin>` uses without a running server; every build a
// team asks for runs its steps as sandboxes through the server's runner.
type OperatorRunner struct{}

// RunSteps implements StepRunner.
func (OperatorRunner) RunSteps(ctx context.Context, req StepRequest) error {
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
