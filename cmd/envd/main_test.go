package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/agentbox/agentbox/api/gen/process"
	"github.com/agentbox/agentbox/api/gen/process/processconnect"
	"github.com/agentbox/agentbox/internal/testutil"
)

// TestInitServesAndReaps runs the static binary as PID 1 of a new PID
// namespace: it must serve, reap the orphans re-parented to it, keep its
// commands' exit statuses, and stop on SIGTERM.
func TestInitServesAndReaps(t *testing.T) {
	testutil.RequireRoot(t)
	bin := filepath.Join(t.TempDir(), "envd")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()

	cmd := exec.Command(bin, "--port", fmt.Sprint(port))
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill() })
	base := fmt.Sprintf("http://127.0.0.1:%d", port)

	waitHealthy(t, base)
	c := processconnect.NewProcessClient(http.DefaultClient, base, connect.WithProtoJSON())
	run := func(script string) *process.ProcessEvent_EndEvent {
		t.Helper()
		s, err := c.Start(context.Background(), connect.NewRequest(&process.StartRequest{
			Process: &process.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", script}},
		}))
		if err != nil {
			t.Fatal(err)
		}
		var end *process.ProcessEvent_EndEvent
		for s.Receive() {
			if e := s.Msg().GetEvent().GetEnd(); e != nil {
				end = e
			}
		}
		if end == nil {
			t.Fatalf("%q: no end event (%v)", script, s.Err())
		}
		return end
	}
	// Orphans: the shell kills its reaper, so it and its background
	// children fall to init.
	for range 5 {
		run("(sleep 0.2 &); true & kill -9 $PPID")
	}
	// Commands started amid the orphans keep their exit statuses.
	for i := range 20 {
		if end := run(fmt.Sprintf("true & exit %d", i+1)); end.GetExitCode() != int32(i+1) {
			t.Fatalf("exit code %d (%s), want %d", end.GetExitCode(), end.GetStatus(), i+1)
		}
	}

	// No zombies among init's children once the orphans are gone.
	deadline := time.Now().Add(10 * time.Second)
	for {
		live, zombies := childrenOf(cmd.Process.Pid)
		if live == 0 && zombies == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("init has %d orphans running and %d zombie children", live, zombies)
		}
		time.Sleep(100 * time.Millisecond)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(15 * time.Second):
		t.Fatal("init did not exit on SIGTERM")
	}
}

func waitHealthy(t *testing.T, base string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get(base + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusNoContent {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatal("envd never became healthy")
}

// childrenOf counts the children of pid (host view) that are not zombies
// and those that are; a live spare reaper (an envd) does not count.
func childrenOf(pid int) (live, zombies int) {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 || f[1] != fmt.Sprint(pid) {
			continue
		}
		switch {
		case f[0] == "Z":
			zombies++
		case !strings.HasSuffix(s[:i], "(envd"):
			live++
		}
	}
	return live, zombies
}
