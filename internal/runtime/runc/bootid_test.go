package runc

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/runtime/bundle"
	"github.com/agentbox/agentbox/internal/testutil"
)

// inMountNS starts a process in a private mount namespace after script
// (run in that namespace) and returns its pid.
func inMountNS(t *testing.T, script string) int {
	t.Helper()
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", script+" && exec sleep 60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	// The script has run once the process is sleep.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if b, _ := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/comm"); strings.TrimSpace(string(b)) == "sleep" {
			return cmd.Process.Pid
		}
		if time.Now().After(deadline) {
			t.Fatalf("%q never reached sleep", script)
		}
	}
}

func nsBootID(t *testing.T, pid int) string {
	t.Helper()
	out, err := exec.Command("nsenter", "--mount", "--target", strconv.Itoa(pid), "cat", bootIDInSandbox).CombinedOutput()
	if err != nil {
		t.Fatalf("read the namespace's boot id: %v: %s", err, out)
	}
	return strings.TrimSpace(string(out))
}

// The boot-id hook mounts the bundle's id over the kernel's in the target's
// mount namespace only, read-only; the host keeps its own. A namespace
// whose boot_id is not procfs's (a file the sandbox made) is refused.
func TestBootIDHook(t *testing.T) {
	testutil.RequireRoot(t)
	b, err := bundle.New(bundle.Config{StateDir: filepath.Join(t.TempDir(), "s"), EnvdPath: "/bin/true", CgroupParent: "agentbox-test", HookBinary: testHookBinary(t)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := &Driver{b: b, log: slog.Default()}
	host := readFileT(t, bootIDInSandbox)
	dir := t.TempDir()
	const id = "0f6c2b1e-8d4a-4c3b-9e2f-7a1b5c6d8e9f"
	if err := writeBootID(dir, id); err != nil {
		t.Fatal(err)
	}

	pid := inMountNS(t, "true")
	if err := d.mountBootID(context.Background(), dir, pid, false); err != nil {
		t.Fatal(err)
	}
	if got := nsBootID(t, pid); got != id {
		t.Fatalf("boot id in the namespace = %q, want %q", got, id)
	}
	if got := readFileT(t, bootIDInSandbox); got != host {
		t.Fatalf("the host's boot id changed: %q -> %q", host, got)
	}
	out, err := exec.Command("nsenter", "--mount", "--target", strconv.Itoa(pid), "sh", "-c", "echo x > "+bootIDInSandbox).CombinedOutput()
	if err == nil {
		t.Fatalf("root wrote the mounted boot id: %s", out)
	}

	// A /proc of the sandbox's own making: nothing is mounted over its file.
	fake := inMountNS(t, "mount -t tmpfs fake /proc && mkdir -p /proc/sys/kernel/random && echo fake > "+bootIDInSandbox)
	if err := d.mountBootID(context.Background(), dir, fake, false); err == nil || !strings.Contains(err.Error(), "not procfs") {
		t.Fatalf("mount over a tmpfs file: err = %v, want a refusal naming procfs", err)
	}
	if got := nsBootID(t, fake); got != "fake" {
		t.Fatalf("fake boot id = %q, want it untouched", got)
	}

	// Outside the target's namespace the hook refuses instead of mounting
	// over the host's.
	if err := RunBootIDHook([]string{"--pid", strconv.Itoa(pid)}, false, false); err == nil {
		t.Fatal("hook outside the target mount namespace succeeded")
	}
	for _, args := range [][]string{nil, {"--pid", "0"}, {"--pid", "1;x"}, {"--pid", "3", "extra"}, {"--pid", "3", "--inotify-instances", "1"}, {"--pid", "3", "--inotify-instances", "-1", "--inotify-watches", "1"}} {
		if err := RunBootIDHook(args, true, true); err == nil {
			t.Errorf("args %q accepted", args)
		}
	}
	// Caps asked for but not set (the constructor did not run) are an error.
	if err := RunBootIDHook([]string{"--pid", "3", "--inotify-instances", "1", "--inotify-watches", "1"}, true, false); err == nil {
		t.Error("caps asked for and not set: accepted")
	}
}

// One hook exec mounts the boot id and sets the inotify caps of the
// sandbox's own user namespace; the host's caps stay as they were, also
// for a sandbox that shares the host's user namespace.
func TestBootIDHookLimitsUserNS(t *testing.T) {
	testutil.RequireRoot(t)
	b, err := bundle.New(bundle.Config{StateDir: filepath.Join(t.TempDir(), "s"), EnvdPath: "/bin/true", CgroupParent: "agentbox-test", HookBinary: testHookBinary(t)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := &Driver{b: b, log: slog.Default()}
	dir := t.TempDir()
	const id = "5a0e7c1d-2b3f-4e6a-8c9d-0f1e2d3c4b5a"
	if err := writeBootID(dir, id); err != nil {
		t.Fatal(err)
	}
	hostCaps := readFileT(t, "/proc/sys/user/max_inotify_instances")

	cmd := exec.Command("sleep", "60")
	m := []syscall.SysProcIDMap{{ContainerID: 0, HostID: 100000, Size: 65536}}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWUSER | unix.CLONE_NEWNS, UidMappings: m, GidMappings: m}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	pid := cmd.Process.Pid
	if err := d.mountBootID(context.Background(), dir, pid, true); err != nil {
		t.Fatal(err)
	}
	if got := nsBootID(t, pid); got != id {
		t.Errorf("boot id in the namespace = %q, want %q", got, id)
	}
	out, err := exec.Command("nsenter", "--user", "--target", strconv.Itoa(pid), "cat", "/proc/sys/user/max_inotify_instances").CombinedOutput()
	if err != nil {
		t.Fatalf("read the namespace's cap: %v: %s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != strconv.Itoa(sandboxInotifyInstances) {
		t.Errorf("namespace's max_inotify_instances = %s, want %d", got, sandboxInotifyInstances)
	}
	if got := readFileT(t, "/proc/sys/user/max_inotify_instances"); got != hostCaps {
		t.Errorf("the host's cap changed: %s -> %s", hostCaps, got)
	}

	// In the host's user namespace: the boot id is mounted, no cap is set.
	shared := inMountNS(t, "true")
	if err := d.mountBootID(context.Background(), dir, shared, true); err != nil {
		t.Fatal(err)
	}
	if got := nsBootID(t, shared); got != id {
		t.Errorf("boot id in the shared-userns namespace = %q, want %q", got, id)
	}
	if got := readFileT(t, "/proc/sys/user/max_inotify_instances"); got != hostCaps {
		t.Errorf("the host's cap changed: %s -> %s", hostCaps, got)
	}
}
