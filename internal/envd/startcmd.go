package envd

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// StartLogDir is where the template start command's output goes by
// default (the runtime bind-mounts the sandbox's host log directory there).
const StartLogDir = "/.agentbox/log"

// startTemplateCommand runs a template's start command (e.g. the code
// interpreter) once per sandbox, in the background, as root, in the default
// workdir, with the sandbox's env vars. Sandbox creation does not wait for
// it; it is not restarted if it exits. It runs in its own process group, so
// it outlives a restart of the envd server (PID 1 reaps it).
func (s *Server) startTemplateCommand(cmdline, workdir string) {
	s.startOnce.Do(func() {
		if err := s.runStartCmd(cmdline, workdir); err != nil {
			s.log.Error("template start command failed to start", "cmd", cmdline, "err", err)
		}
	})
}

func (s *Server) runStartCmd(cmdline, workdir string) error {
	root, err := s.users.Lookup("root")
	if err != nil {
		root = &User{Name: "root", Home: "/root"}
	}
	if err := os.MkdirAll(s.startLogDir, 0o755); err != nil {
		return fmt.Errorf("log dir: %w", err)
	}
	logFile, err := os.OpenFile(filepath.Join(s.startLogDir, "start.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("log file: %w", err)
	}
	cmd := exec.Command("/bin/sh", "-c", cmdline)
	cmd.Env = s.processEnv(root, nil)
	if fi, err := os.Stat(workdir); err == nil && fi.IsDir() {
		cmd.Dir = workdir
	} else {
		cmd.Dir = "/"
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// In the user cgroup, with what it starts (the code interpreter's kernels).
	if err := s.children.Start(cmd, func() error { return startInUserCgroup(cgroupMount, cmd.SysProcAttr, cmd.Start) }); err != nil {
		logFile.Close()
		return err
	}
	logFile.Close() // the child has its own copy
	// As for commands (reaper_linux.go); the shell's first instructions
	// may run before this, but what it starts later inherits it.
	if err := oomBeforeEnvd(strconv.Itoa(cmd.Process.Pid)); err != nil {
		s.log.Debug("the start command's OOM score stays envd's", "err", err)
	}
	s.log.Info("template start command started", "cmd", cmdline, "pid", cmd.Process.Pid, "dir", cmd.Dir)
	go func() {
		t0 := time.Now()
		err := s.children.Wait(cmd)
		s.log.Warn("template start command exited", "cmd", cmdline, "err", err, "after", time.Since(t0).Round(time.Millisecond))
	}()
	return nil
}
