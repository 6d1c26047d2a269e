package runc

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestRemoveIfInitGone: a container's runc record is removed without runc
// only when its init surely no longer runs; a live init (or an unreadable
// record) leaves it to `runc delete --force`.
func TestRemoveIfInitGone(t *testing.T) {
	alive := exec.Command("sleep", "30")
	if err := alive.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = alive.Process.Kill(); _ = alive.Wait() })
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	start := func(pid int) uint64 {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		n, err := strconv.ParseUint(f[19], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	tests := []struct {
		name    string
		state   string
		removed bool
	}{
		{"init runs", fmt.Sprintf(`{"init_process_pid":%d,"init_process_start":%d}`, alive.Process.Pid, start(alive.Process.Pid)), false},
		{"init exited", fmt.Sprintf(`{"init_process_pid":%d,"init_process_start":1}`, dead.Process.Pid), true},
		{"pid taken by another process", fmt.Sprintf(`{"init_process_pid":%d,"init_process_start":%d}`, alive.Process.Pid, start(alive.Process.Pid)+1), true},
		{"no pid", `{"init_process_pid":0}`, false},
		{"unreadable", `{`, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "c")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "state.json"), []byte(tc.state), 0o600); err != nil {
				t.Fatal(err)
			}
			got := removeIfInitGone(dir)
			_, err := os.Stat(dir)
			if got != tc.removed || os.IsNotExist(err) != tc.removed {
				t.Fatalf("removed %v (dir: %v), want %v", got, err, tc.removed)
			}
		})
	}
}
