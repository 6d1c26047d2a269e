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

// TestInitSupervisesServer runs the static binary as PID 1 of a new PID
// namespace: the server must come up, be restarted after it is killed,
// orphans must be reaped, and SIGTERM must stop everything.
func TestInitSupervisesServer(t *testing.T) {
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
	// Leave an orphan behind, then kill the server (the shell's parent).
	s, err := c.Start(context.Background(), connect.NewRequest(&process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", "(sleep 0.2 &); kill -9 $PPID"}},
	}))
	if err != nil {
		t.Fatal(err)
	}
	for s.Receive() {
	}
	waitHealthy(t, base) // restarted

	// No zombies among init's children once the orphans are gone.
	deadline := time.Now().Add(10 * time.Second)
	for {
		zombies := zombieChildren(cmd.Process.Pid)
		if zombies == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d zombie children of init", zombies)
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

// zombieChildren counts zombie processes whose parent is pid (host view).
func zombieChildren(pid int) int {
	ents, _ := os.ReadDir("/proc")
	n := 0
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
		if len(f) >= 2 && f[0] == "Z" && f[1] == fmt.Sprint(pid) {
			n++
		}
	}
	return n
}
