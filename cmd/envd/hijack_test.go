package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/agentbox/agentbox/api/gen/process"
	"github.com/agentbox/agentbox/api/gen/process/processconnect"
	"github.com/agentbox/agentbox/internal/testutil"
)

// ptraceAttach is a python attacker: PTRACE_ATTACH to each pid, then open
// its /proc mem. It prints one word per pid: "refused" or what it got.
// (/proc/<pid>/environ stays readable to root without CAP_SYS_PTRACE on
// this kernel even for a non-dumpable process; envd's environment is the
// runtime's static one, the token only ever arrives over /init.)
const ptraceAttach = `import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
for p in sys.argv[1:]:
    pid = int(p)
    got = []
    if libc.ptrace(ctypes.c_long(16), ctypes.c_long(pid), None, None) == 0:
        got.append("attached")
        libc.ptrace(ctypes.c_long(17), ctypes.c_long(pid), None, None)
    for f in ("mem",):
        try:
            open("/proc/%d/%s" % (pid, f), "rb").close()
            got.append(f)
        except OSError:
            pass
    print(p, ",".join(got) or "refused")
`

// TestRootCannotHijackEnvd attacks the real binary the way sandbox root
// does: root without CAP_SYS_PTRACE (the sandbox's capability set) tries
// to ptrace and read the memory of envd (init and server in one process)
// and a command's reaper. A dumpable root process (sleep) is the control the same attacker
// can read.
func TestRootCannotHijackEnvd(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := exec.LookPath("python3"); err != nil {
		t.Fatal("python3 is needed for the ptrace attacker (install-deps installs it)")
	}
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
	// Everything runs without CAP_SYS_PTRACE, as in a sandbox.
	noPtrace := []string{"--inh-caps=-sys_ptrace", "--bounding-set=-sys_ptrace", "--"}
	cmd := exec.Command("setpriv", append(noPtrace, bin, "--port", fmt.Sprint(port))...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	waitHealthy(t, base)

	c := processconnect.NewProcessClient(http.DefaultClient, base, connect.WithProtoJSON())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := c.Start(ctx, connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/sleep", Args: []string{"60"}}}))
	if err != nil {
		t.Fatal(err)
	}
	s.Receive() // started
	control := exec.Command("setpriv", append(noPtrace, "sleep", "60")...)
	if err := control.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { control.Process.Kill(); control.Wait() })

	envd := cmd.Process.Pid
	reaper := childOf(envd, "reap")
	if reaper == 0 {
		t.Fatalf("the command's reaper was not found under envd %d", envd)
	}
	pids := []int{envd, reaper, control.Process.Pid}
	args := append(noPtrace, "python3", "-c", ptraceAttach)
	for _, p := range pids {
		args = append(args, strconv.Itoa(p))
	}
	out, err := exec.Command("setpriv", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("attacker: %v\n%s", err, out)
	}
	got := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Fields(l); len(f) == 2 {
			got[f[0]] = f[1]
		}
	}
	// The reaper is left dumpable (it holds no secret, its user may kill it
	// anyway, and CRIU must checkpoint it): only envd.
	if r := got[strconv.Itoa(envd)]; r != "refused" {
		t.Errorf("envd (pid %d): the attacker got %q", envd, r)
	}
	if r := got[strconv.Itoa(control.Process.Pid)]; r != "attached,mem" {
		t.Errorf("control (a dumpable root process): the attacker got %q; this test cannot tell the defence from its absence", r)
	}
}

// childOf finds a child of pid whose command line contains word.
func childOf(pid int, word string) int {
	for range 100 {
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			c, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
			if err != nil {
				continue
			}
			s := string(b)
			i := strings.LastIndexByte(s, ')')
			f := strings.Fields(s[i+1:])
			if len(f) < 2 || f[1] != strconv.Itoa(pid) {
				continue
			}
			if cl, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline")); strings.Contains(string(cl), word) {
				return c
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return 0
}
