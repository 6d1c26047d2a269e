package soak

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/bench/benchmark"
	"github.com/agentbox/agentbox/e2e/harness"
)

// hostScope is the share of the host that server s owns: its process, data
// dir, instance (runc roots, cgroups) and bridge.
func hostScope(t *testing.T, s *harness.Server, metricsToken string) benchmark.HostScope {
	t.Helper()
	return benchmark.HostScope{ServerPID: servePID(t, s), DataDir: s.DataDir, Instance: s.Instance, Bridge: s.Bridge,
		MetricsURL: s.URL + "/metrics", MetricsToken: metricsToken}
}

// servePID finds the serve process of s by its --instance.
func servePID(t *testing.T, s *harness.Server) int {
	t.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := bytes.Split(b, []byte{0})
		if len(args) < 2 || string(args[1]) != "serve" || !bytes.Contains(b, []byte("\x00"+s.Instance+"\x00")) {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p))); err == nil {
			return pid
		}
	}
	t.Fatalf("no serve process of instance %s", s.Instance)
	return 0
}

// openFiles lists what pid's open files point at, sockets with their TCP
// peers where known, so a leak names its kind.
func openFiles(pid int) map[string]int {
	out := map[string]int{}
	fds, _ := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", pid))
	tcp := map[string]string{}
	for _, f := range []string{"tcp", "tcp6"} {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, f))
		for _, line := range strings.Split(string(b), "\n")[1:] {
			x := strings.Fields(line)
			if len(x) > 9 {
				tcp[x[9]] = "tcp " + x[1] + "->" + x[2] + " st " + x[3]
			}
		}
	}
	for _, fd := range fds {
		l, err := os.Readlink(fd)
		if err != nil {
			continue
		}
		if ino, ok := strings.CutPrefix(l, "socket:["); ok {
			if d, ok := tcp[strings.TrimSuffix(ino, "]")]; ok {
				l = "tcp peer " + d[strings.Index(d, "->")+2:]
			} else {
				l = "socket (not tcp)"
			}
		}
		out[l]++
	}
	return out
}
