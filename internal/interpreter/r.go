package interpreter

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
)

type rConfig struct {
	R          string // R binary with IRkernel installed (Debian: r-cran-irkernel)
	RuntimeDir string // parent of per-kernel connection-file dirs
	Cwd        string
	Log        io.Writer // the kernel process's own stdout/stderr (never user output)
}

// startR launches IRkernel, a Jupyter kernel, and returns once it answered
// a kernel_info_request.
func startR(ctx context.Context, cfg rConfig) (*jupyterKernel, error) {
	dir, err := os.MkdirTemp(cfg.RuntimeDir, "r-")
	if err != nil {
		return nil, fmt.Errorf("r kernel: %w", err)
	}
	// Unlike ipykernel, IRkernel does not pick its own ports: it binds the
	// ones the connection file names. Ports free a moment ago are taken
	// by something else only in a rare race, which fails the start.
	ci, err := freeConnection()
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("r kernel: %w", err)
	}
	b, err := json.Marshal(ci)
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("r kernel: %w", err)
	}
	connFile := filepath.Join(dir, "kernel.json")
	if err := os.WriteFile(connFile, b, 0o600); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("r kernel: %w", err)
	}
	// IRkernel's own kernelspec command line, with two changes. An
	// interrupt reaching the kernel while idle (its cell ended as the
	// client gave up) is resumed from instead of ending R with all its
	// state: a running cell's own interrupt handler is innermost and still
	// stops the cell. And system()/system2() ignore SIGINT while their
	// command runs (as POSIX system() does), so a cell looping over them
	// could not be interrupted: once one returns while the interrupt flag
	// is set, R interrupts itself.
	cmd := exec.Command(cfg.R, "--slave", "-e", rInterruptTrace+
		`withCallingHandlers(IRkernel::main(), interrupt = function(c) invokeRestart("resume"))`,
		"--args", connFile)
	cmd.Dir = cfg.Cwd
	flag := filepath.Join(dir, "interrupted")
	cmd.Env = kernelEnv(map[string]string{"JPY_SESSION_NAME": "", "AGENTBOX_INTERRUPT_FLAG": flag})
	k, err := startJupyter(ctx, cmd, "IRkernel (r-cran-irkernel)", dir, connFile, cfg.Log)
	if err != nil {
		return nil, fmt.Errorf("r kernel: %w", err)
	}
	k.interruptFlag = flag
	return k, nil
}

// rInterruptTrace makes system() and system2() interrupt R on return
// while the file named by AGENTBOX_INTERRUPT_FLAG exists. It signals the
// interrupt condition as R's own SIGINT handler does (with a "resume"
// restart, then back to top level) instead of sending R a SIGINT: once a
// background command was started (system(wait = FALSE)), such a signal
// stays pending while the next system() call ignores it.
const rInterruptTrace = `local({
  f <- Sys.getenv("AGENTBOX_INTERRUPT_FLAG")
  h <- bquote(if (file.exists(.(f))) withRestarts({
    signalCondition(structure(class = c("interrupt", "condition"), list(message = "", call = NULL)))
    invokeRestart("abort")
  }, resume = function() NULL))
  for (fn in c("system", "system2")) suppressMessages(trace(fn, exit = h, print = FALSE, where = baseenv()))
  Sys.unsetenv("AGENTBOX_INTERRUPT_FLAG")
});
`

// freeConnection is a connection description on free loopback ports with a
// fresh signing key.
func freeConnection() (connectionInfo, error) {
	var ports [5]int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return connectionInfo{}, fmt.Errorf("find a free port: %w", err)
		}
		ls = append(ls, l)
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return connectionInfo{
		Transport: "tcp", IP: "127.0.0.1",
		ShellPort: ports[0], IOPubPort: ports[1], StdinPort: ports[2], ControlPort: ports[3], HBPort: ports[4],
		Key: newID(), SignatureScheme: "hmac-sha256",
	}, nil
}
