package envd

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

// RunInit is envd as the container's PID 1: it runs the server as a child
// process (argv: /proc/self/exe serverArgs...), reaps every zombie, forwards
// SIGTERM/SIGINT/SIGHUP to the server and restarts it if it dies. The server
// is a separate process because a Go program that reaps with wait4(-1)
// steals the exit status of its own exec.Cmd children.
func RunInit(ctx context.Context, log *slog.Logger, serverArgs []string) error {
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGCHLD, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sigs)

	var child *os.Process
	start := func() {
		cmd := exec.Command("/proc/self/exe", serverArgs...)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, os.Stdout, os.Stderr
		cmd.Env = os.Environ()
		if err := cmd.Start(); err != nil {
			log.Error("init: start server", "err", err)
			child = nil
			return
		}
		child = cmd.Process
		log.Info("init: server started", "pid", child.Pid)
	}
	start()
	var stopping bool
	var stopSig os.Signal
	backoff := time.Duration(0)
	restart := time.NewTimer(time.Hour)
	restart.Stop()
	for {
		select {
		case <-ctx.Done():
			if child != nil {
				_ = child.Signal(syscall.SIGTERM)
			}
			stopping = true
		case <-restart.C:
			if !stopping {
				start()
			}
		case sig := <-sigs:
			if sig != syscall.SIGCHLD {
				stopping, stopSig = true, sig
				if child != nil {
					_ = child.Signal(sig)
				} else {
					return nil
				}
				continue
			}
			// Reap everything that has exited; orphans are re-parented to us.
			for {
				var ws syscall.WaitStatus
				pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
				if pid <= 0 || errors.Is(err, syscall.ECHILD) {
					break
				}
				if child == nil || pid != child.Pid {
					continue
				}
				child = nil
				if stopping {
					log.Info("init: server stopped", "signal", stopSig, "status", ws)
					return nil
				}
				// Restart with a growing pause so a crash loop does not spin.
				backoff = min(max(backoff*2, 100*time.Millisecond), 5*time.Second)
				log.Error("init: server died; restarting", "status", waitStatusString(ws), "in", backoff)
				restart.Reset(backoff)
			}
		}
	}
}

func waitStatusString(ws syscall.WaitStatus) string {
	switch {
	case ws.Exited():
		return "exit status " + strconv.Itoa(ws.ExitStatus())
	case ws.Signaled():
		return "signal: " + ws.Signal().String()
	}
	return "unknown"
}
