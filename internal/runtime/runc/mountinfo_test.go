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

// No mount of the sandbox names a host path: not the bind mounts of its
// /etc files, boot id, log dir and envd (bound from the bundle's view), in
// its own mountinfo nor in envd's, nor in /proc/self/mounts.
func TestMountinfoHidesHostPaths(t *testing.T) {
	for _, userns := range []bool{false, true} {
		t.Run(fmt.Sprintf("userns=%v", userns), func(t *testing.T) {
			e := setup(t, userns)
			ep := e.sandbox(t, "mi2", runtime.Resources{MemoryMB: 256})
			host := []string{e.bcfg.StateDir, e.runcRoot, e.b.Dir("mi2"), filepath.Dir(e.bcfg.EnvdPath)}
			for _, f := range []string{"/proc/self/mountinfo", "/proc/1/mountinfo", "/proc/self/mounts"} {
				text := get(t, ep, "read?p="+f)
				for _, want := range []string{" /etc/hosts ", " /etc/resolv.conf ", " /.agentbox/log "} {
					if f != "/proc/self/mounts" && !strings.Contains(text, want) {
						t.Fatalf("%s has no mount on%s: the check would see nothing:\n%s", f, want, text)
					}
				}
				for line := range strings.Lines(text) {
					for _, p := range host {
						if strings.Contains(line, p) {
							t.Errorf("%s names host path %s: %s", f, p, line)
						}
					}
				}
			}
		})
	}
}
