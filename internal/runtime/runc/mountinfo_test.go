package runc

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/runtime"
)

// The sandbox's root filesystem names no host path in the sandbox's own
// mountinfo: not the template layers, the idmapped copies of them, the
// bundle's upper and work dirs, nor the server's state dirs.
func TestRootfsMountinfoHidesHostPaths(t *testing.T) {
	for _, userns := range []bool{false, true} {
		t.Run(fmt.Sprintf("userns=%v", userns), func(t *testing.T) {
			e := setup(t, userns)
			ep := e.sandbox(t, "mi1", runtime.Resources{MemoryMB: 256})
			host := append([]string{e.bcfg.StateDir, e.runcRoot, e.b.Dir("mi1")}, e.layers...)
			for _, l := range e.layers {
				host = append(host, filepath.Dir(l))
			}
			var root string
			for line := range strings.Lines(get(t, ep, "read?p=/proc/self/mountinfo")) {
				if f := strings.Fields(line); len(f) > 4 && f[4] == "/" {
					root = line
				}
			}
			if !strings.Contains(root, " - overlay ") {
				t.Fatalf("no overlay root in the sandbox's mountinfo (root line %q)", root)
			}
			for _, p := range host {
				if strings.Contains(root, p) {
					t.Errorf("the sandbox's root mount names host path %s: %s", p, root)
				}
			}
		})
	}
}
