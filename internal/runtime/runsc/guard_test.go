package runsc

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

func TestOverLine(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		name         string
		usage, limit uint64
		procs        int
		want         bool
	}{
		{"no limit", 900 * mib, 0, 3000, false},
		{"unlimited (v1 max)", 900 * mib, 1 << 63, 3000, false},
		{"well under a 1 GiB limit", 300 * mib, 1024 * mib, 3000, false},
		{"just under the line of a 1 GiB limit (half)", 511 * mib, 1024 * mib, 3000, false},
		{"at the line of a 1 GiB limit", 512 * mib, 1024 * mib, 3000, true},
		{"256 MiB limit: a quarter of it", 64 * mib, 256 * mib, 3000, true},
		{"256 MiB limit under its line", 63 * mib, 256 * mib, 3000, false},
		{"8 GiB limit: headroom capped at 1 GiB", 7167 * mib, 8 * 1024 * mib, 3000, false},
		{"8 GiB limit at its line", 7168 * mib, 8 * 1024 * mib, 3000, true},
		{"a workload's own memory near the limit (few host processes)", 1000 * mib, 1024 * mib, 40, false},
		{"just enough host processes", 1000 * mib, 1024 * mib, 256, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := overLine(tc.usage, tc.limit, tc.procs); got != tc.want {
				t.Errorf("overLine(%d MiB, %d MiB) = %v, want %v", tc.usage/mib, tc.limit/mib, got, tc.want)
			}
		})
	}
}

func TestTargetGroups(t *testing.T) {
	const header = "UID       PID       PPID      PGID      C         TTY       STIME     TIME      CMD\n"
	line := func(pid, ppid, pgid int) string {
		return fmt.Sprintf("0 %d %d %d 1 ? 19:39 0s sh\n", pid, ppid, pgid)
	}
	bomb := func(pgid, n, from int) string {
		var b strings.Builder
		for i := range n {
			b.WriteString(line(from+i, pgid, pgid))
		}
		return b.String()
	}
	envd := line(1, 0, 1) + line(2, 1, 1)
	for _, tc := range []struct {
		name string
		ps   string
		want []int
	}{
		{"envd alone: nothing to kill", header + envd, nil},
		{"one command", header + envd + line(9, 1, 9) + line(17, 9, 9), []int{9}},
		{"a bomb beside small commands: the bomb only", header + envd + bomb(9, 3, 10) + bomb(20, 500, 30) + bomb(15, 2, 600), []int{20}},
		{"two bombs: both, largest first", header + envd + bomb(9, 100, 10) + bomb(200, 300, 200), []int{200, 9}},
		{"envd's group is never a target however large", header + envd + bomb(1, 900, 10) + line(1000, 1, 1000), []int{1000}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ps, err := parsePS([]byte(tc.ps))
			if err != nil {
				t.Fatal(err)
			}
			if got := targetGroups(ps); !slices.Equal(got, tc.want) {
				t.Errorf("targetGroups = %v, want %v", got, tc.want)
			}
		})
	}
	for _, bad := range []string{"UID PID PPID C TTY STIME TIME CMD\n0 1 0 0 ? 19:39 0s envd\n", header + "0 x 1 1 1 ? 19:39 0s sh\n"} {
		if _, err := parsePS([]byte(bad)); err == nil {
			t.Errorf("parsePS accepted %q", bad)
		}
	}
}

func TestPartlySignalled(t *testing.T) {
	for _, tc := range []struct {
		msg  string
		want bool
	}{
		{`runsc kill: exit status 128: failed to signal process group 22: signaling container "c" PGID 22: signaling process group 22: no such process`, true},
		{`runsc kill: exit status 128: failed to signal process group 22: signaling container "c" PGID 22: signaling process group 22: no such process group with PGID 22`, false},
		{`runsc kill: exit status 128: connecting to control server: connection refused`, false},
	} {
		if got := partlySignalled(errors.New(tc.msg)); got != tc.want {
			t.Errorf("partlySignalled(%q) = %v, want %v", tc.msg, got, tc.want)
		}
	}
}
