package runc

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/agentbox/agentbox/internal/runtime"
)

func TestPagesSize(t *testing.T) {
	img := t.TempDir()
	for name, n := range map[string]int{"pages-1.img": 3000, "pages-2.img": 5000, "pagemap-1.img": 100000, "inventory.img": 9} {
		if err := os.WriteFile(filepath.Join(img, name), make([]byte, n), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if got := pagesSize(img); got != 8000 {
		t.Fatalf("pagesSize = %d, want 8000 (pages-*.img only)", got)
	}
}

func TestLazyWanted(t *testing.T) {
	img := t.TempDir()
	if err := os.WriteFile(filepath.Join(img, "pages-1.img"), make([]byte, 2<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		threshold int
		mode      runtime.Lazy
		off       string
		want      bool
	}{
		{name: "below the threshold", threshold: 3, mode: runtime.LazyAuto, want: false},
		{name: "at the threshold", threshold: 2, mode: runtime.LazyAuto, want: true},
		{name: "never by flag", threshold: -1, mode: runtime.LazyAuto, want: false},
		{name: "always by the sandbox", threshold: 100, mode: runtime.LazyAlways, want: true},
		{name: "never by the sandbox", threshold: 1, mode: runtime.LazyNever, want: false},
		{name: "unavailable", threshold: 1, mode: runtime.LazyAlways, off: "no userfaultfd", want: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &Driver{cfg: Config{LazyResumeMB: tc.threshold}}
			d.lazy.probe.Do(func() {}) // the host's probe is not under test
			d.lazy.off = tc.off
			got, why := d.lazyWanted(img, tc.mode)
			if got != tc.want {
				t.Fatalf("lazyWanted = %v (%q), want %v", got, why, tc.want)
			}
			if tc.off != "" && why != tc.off {
				t.Fatalf("why = %q, want %q", why, tc.off)
			}
		})
	}
}

// TestLazyPidRecord checks that a daemon's record names exactly that
// process: a live one is found and killed, a record of an exited process
// (or a reused pid) is not.
func TestLazyPidRecord(t *testing.T) {
	dir := t.TempDir()
	if _, ok := lazyPid(dir); ok {
		t.Fatal("lazyPid found a daemon without a record")
	}
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
	if err := writeLazyPid(dir, cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if pid, ok := lazyPid(dir); !ok || pid != cmd.Process.Pid {
		t.Fatalf("lazyPid = %d, %v; want %d", pid, ok, cmd.Process.Pid)
	}
	// Same pid, other start time: a different process.
	if err := os.WriteFile(filepath.Join(dir, lazyPidFile), []byte(strconv.Itoa(cmd.Process.Pid)+" 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, ok := lazyPid(dir); ok {
		t.Fatal("lazyPid accepted a record whose start time differs")
	}
	if err := writeLazyPid(dir, cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if err := killLazyDir(context.Background(), dir); err != nil {
		t.Fatal(err)
	}
	<-done
	if _, err := os.Stat(filepath.Join(dir, lazyPidFile)); !os.IsNotExist(err) {
		t.Fatalf("record left after killLazyDir: %v", err)
	}
	if err := waitLazyGone(context.Background(), dir); err != nil {
		t.Fatal(err)
	}
}

func TestUffdFailed(t *testing.T) {
	for _, tc := range []struct {
		log  string
		want bool
	}{
		{"(00.2) 30: Error (criu/uffd.c:332): uffd: Unable to open an userfaultfd descriptor: Operation not permitted\n", true},
		{"(00.1) uffd: Lazy pages are not available: Function not implemented\n", true},
		{"(00.1) Error (criu/files-reg.c:1): File x has bad size\n", false},
	} {
		work := t.TempDir()
		if err := os.WriteFile(filepath.Join(work, "restore.log"), []byte(tc.log), 0o600); err != nil {
			t.Fatal(err)
		}
		if got := uffdFailed(work); got != tc.want {
			t.Errorf("uffdFailed(%q) = %v, want %v", tc.log, got, tc.want)
		}
	}
}

// TestRestoreInFlight finds a process by its `restore ... --bundle dir`
// arguments, as a restarted server finds the runc restore of its
// predecessor.
func TestRestoreInFlight(t *testing.T) {
	dir := t.TempDir()
	if restoreInFlight(dir) {
		t.Fatal("restoreInFlight without any restore")
	}
	cmd := exec.Command("/bin/sh", "-c", "sleep 60; :", "restore", "--bundle", dir) // not the last command: the shell stays
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if !restoreInFlight(dir) {
		t.Fatal("restoreInFlight missed a restore of the bundle")
	}
	if restoreInFlight(dir + "x") {
		t.Fatal("restoreInFlight matched another bundle")
	}
}
