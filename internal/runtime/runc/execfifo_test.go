package runc

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestStartThroughFifo plays runc init's side of the exec fifo with a
// shell: a start returns once the init wrote its byte and closed its end
// (its exec), and removes the fifo, as `runc start` does; an init that
// closes its end without the byte, or dies without opening it, fails the
// start instead of hanging it; a state dir without a fifo asks for the
// fallback.
func TestStartThroughFifo(t *testing.T) {
	tests := []struct {
		name   string
		script string // $1 is the fifo
		ok     bool
	}{
		{"init writes its byte and execs", `printf 0 > "$1"; exec sleep 5`, true},
		{"init closes without the byte", `: > "$1"; exec sleep 5`, false},
		{"init dies before opening the fifo", `sleep 0.2`, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			fifo := filepath.Join(dir, execFifo)
			if err := unix.Mkfifo(fifo, 0o600); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command("sh", "-c", tc.script, "init", fifo)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			go func() { _ = cmd.Wait(); close(done) }()
			t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			err := startThroughFifo(ctx, dir, cmd.Process.Pid)
			if ctx.Err() != nil {
				t.Fatalf("start waited for its deadline: %v", err)
			}
			if tc.ok != (err == nil) {
				t.Fatalf("start: %v, want success %v", err, tc.ok)
			}
			if _, serr := os.Stat(fifo); tc.ok && !os.IsNotExist(serr) {
				t.Errorf("fifo left after a start (runc would see the container as created): %v", serr)
			}
		})
	}
	t.Run("no fifo", func(t *testing.T) {
		if err := startThroughFifo(t.Context(), t.TempDir(), os.Getpid()); !errors.Is(err, errNoExecFifo) {
			t.Fatalf("start without a fifo: %v, want errNoExecFifo", err)
		}
	})
}
