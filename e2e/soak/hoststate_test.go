package soak

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
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
