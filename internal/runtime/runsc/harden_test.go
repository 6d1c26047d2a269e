package runsc

import (
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestHardenReserve(t *testing.T) {
	p := func(v int64) *int64 { return &v }
	for _, c := range []struct {
		name     string
		res      *specs.LinuxResources
		wantArgs []string
		wantRW   bool
	}{
		{"no limits: no user cgroup", nil, nil, false},
		{"pids and memory", &specs.LinuxResources{Pids: &specs.LinuxPids{Limit: p(4096)}, Memory: &specs.LinuxMemory{Limit: p(1 << 30)}},
			[]string{"--user-pids", "3584", "--user-memory", "939524096"}, true},
		{"pids only", &specs.LinuxResources{Pids: &specs.LinuxPids{Limit: p(256)}}, []string{"--user-pids", "192"}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &specs.Spec{
				Process: &specs.Process{Args: []string{"envd"}},
				Mounts:  []specs.Mount{{Destination: "/sys/fs/cgroup", Type: "cgroup", Options: []string{"nosuid", "ro"}}},
				Linux:   &specs.Linux{Resources: c.res},
			}
			harden(s)
			if got := s.Process.Args[1:]; !slices.Equal(got, c.wantArgs) {
				t.Errorf("envd args %q; want %q", got, c.wantArgs)
			}
			if rw := !slices.Contains(s.Mounts[0].Options, "ro"); rw != c.wantRW {
				t.Errorf("cgroup mount options %q: read-write %v, want %v", s.Mounts[0].Options, rw, c.wantRW)
			}
		})
	}
}
