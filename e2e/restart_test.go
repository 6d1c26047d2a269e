package e2e

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
	"github.com/agentbox/agentbox/e2e/wire"
	"github.com/agentbox/agentbox/internal/network"
	"github.com/agentbox/agentbox/internal/runtime/bundle"
)

// TestRestartKeepsSandboxes kills the server with SIGKILL, starts it again on
// the same data dir, and expects the earlier sandbox to still run, answer and
// list; killing it afterwards must leave nothing behind on the host.
func TestRestartKeepsSandboxes(t *testing.T) {
	s := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	c := s.client()

	sb, err := c.Create(ctx, wire.CreateRequest{TemplateID: "base", Timeout: 1800, Metadata: map[string]string{"e2e": "restart"}})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	killed := false
	defer func() {
		if !killed {
			_ = s.client().Kill(context.Background(), sb.SandboxID)
		}
	}()
	r, err := c.Run(ctx, sb, "user", "echo before > /tmp/mark; sleep 3600 >/dev/null 2>&1 & echo $!")
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("run before restart: %v %+v", err, r)
	}
	sleeperPID := strings.TrimSpace(r.Stdout)

	s.Kill9(t)
	s.Launch(t)
	c = s.client()

	r, err = c.Run(ctx, sb, "user", "cat /tmp/mark; kill -0 "+sleeperPID+" && echo alive")
	if err != nil {
		t.Fatalf("run after restart: %v", err)
	}
	if r.Stdout != "before\nalive\n" {
		t.Fatalf("after restart: stdout %q stderr %q exit %d; want the file and the background process", r.Stdout, r.Stderr, r.ExitCode)
	}
	list, err := c.List(ctx, map[string]string{"e2e": "restart"})
	if err != nil {
		t.Fatalf("list after restart: %v", err)
	}
	if len(list) != 1 || list[0].SandboxID != sb.SandboxID || list[0].State != "running" {
		t.Fatalf("list after restart = %+v, want only %s running", list, sb.SandboxID)
	}

	// The leak checks below must be able to see a live sandbox, else they
	// prove nothing.
	if len(runcContainers(s, sb.SandboxID)) == 0 {
		t.Errorf("runc --root /run/%s/runc list does not show running sandbox %s", s.Instance, sb.SandboxID)
	}
	if len(netnsFiles(s.Instance, sb.SandboxID)) == 0 {
		t.Errorf("no netns pin under /run/%s/netns for running sandbox %s", s.Instance, sb.SandboxID)
	}
	if len(cgroupDirs(s, sb.SandboxID)) == 0 {
		t.Errorf("no cgroup dir /sys/fs/cgroup/<ctrl>/%s/%s for running sandbox", s.Instance, sb.SandboxID)
	}

	if err := c.Kill(ctx, sb.SandboxID); err != nil {
		t.Fatalf("kill: %v", err)
	}
	killed = true
	if _, err := c.Get(ctx, sb.SandboxID); !wire.IsStatus(err, 404) {
		t.Fatalf("get after kill: %v, want 404", err)
	}
	if err := c.EnvdHealth(ctx, sb); !wire.IsStatus(err, 502) {
		t.Fatalf("envd health after kill: %v, want 502", err)
	}
	assertNoLeaks(t, s, sb.SandboxID)
}

// TestRestartKeepsGVisorSandboxes is the SIGKILL restart on the gVisor tier,
// whose netstack takes the sandbox's address off its network namespace.
func TestRestartKeepsGVisorSandboxes(t *testing.T) {
	s := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	c := s.client()
	sb, err := c.Create(ctx, wire.CreateRequest{TemplateID: "base", Timeout: 1800, Metadata: map[string]string{"agentbox.isolation": "gvisor"}})
	if err != nil {
		t.Fatalf("create on gvisor: %v", err)
	}
	defer func() { _ = s.client().Kill(context.Background(), sb.SandboxID) }()
	r, err := c.Run(ctx, sb, "user", "uname -r; echo before > /tmp/mark; sleep 3600 >/dev/null 2>&1 & echo $!")
	if err != nil || r.ExitCode != 0 || !strings.Contains(r.Stdout, "gvisor") {
		t.Fatalf("run before restart: %v %+v (want a gVisor kernel)", err, r)
	}
	sleeperPID := strings.TrimSpace(strings.Split(strings.TrimSpace(r.Stdout), "\n")[1])
	survivesKill9(ctx, t, s, sb, sleeperPID)
}

// survivesKill9 kills the server with SIGKILL and starts it again, then
// checks that sb still has its /tmp/mark file and its background process
// sleeperPID, and that killing it leaves nothing behind.
func survivesKill9(ctx context.Context, t *testing.T, s *server, sb *wire.Sandbox, sleeperPID string) {
	t.Helper()
	s.Kill9(t)
	s.Launch(t)
	c := s.client()
	r, err := c.Run(ctx, sb, "user", "cat /tmp/mark; kill -0 "+sleeperPID+" && echo alive")
	if err != nil || r.Stdout != "before\nalive\n" {
		t.Fatalf("after restart: %v %+v; want the file and the background process\n%s", err, r, s.LogTail(50))
	}
	if err := c.Kill(ctx, sb.SandboxID); err != nil {
		t.Fatalf("kill: %v", err)
	}
	assertNoLeaks(t, s, sb.SandboxID)
}

// TestRestartKeepsMicroVMSandboxes is the SIGKILL restart on the microvm
// tier: QEMU outlives the server, which finds it again by its pid file and
// state directory and keeps serving the guest, memory and all.
func TestRestartKeepsMicroVMSandboxes(t *testing.T) {
	s := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	c := s.client()
	sb, err := c.Create(ctx, wire.CreateRequest{TemplateID: "base", Timeout: 1800, Metadata: map[string]string{"agentbox.isolation": "microvm"}})
	if err != nil {
		t.Fatalf("create on microvm: %v", err)
	}
	defer func() { _ = s.client().Kill(context.Background(), sb.SandboxID) }()
	host, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.Run(ctx, sb, "user", "uname -r; echo before > /tmp/mark; sleep 3600 >/dev/null 2>&1 & echo $!")
	if err != nil || r.ExitCode != 0 || strings.HasPrefix(r.Stdout, strings.TrimSpace(string(host))+"\n") {
		t.Fatalf("run before restart: %v %+v (want a guest kernel, not the host's %s)", err, r, host)
	}
	sleeperPID := strings.TrimSpace(strings.Split(strings.TrimSpace(r.Stdout), "\n")[1])
	assertQEMUChrooted(t, s.DataDir)
	survivesKill9(ctx, t, s, sb, sleeperPID)
}

// assertQEMUChrooted checks that the server's one QEMU runs in an empty
// root: no host file (not even /etc) is in its reach.
func assertQEMUChrooted(t *testing.T, dataDir string) {
	t.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	found := 0
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(b), "qemu-system") || !strings.Contains(string(b), dataDir+"/") {
			continue
		}
		found++
		dir := filepath.Dir(p)
		root, err := os.Readlink(filepath.Join(dir, "root"))
		if err != nil || !strings.HasSuffix(root, "/microvm/empty") {
			t.Errorf("QEMU %s runs in root %q (%v), want the empty microvm/empty", dir, root, err)
		}
		if entries, err := os.ReadDir(filepath.Join(dir, "root")); err != nil || len(entries) != 0 {
			t.Errorf("QEMU %s sees %d entries in its root (%v), want none", dir, len(entries), err)
		}
	}
	if found != 1 {
		t.Fatalf("found %d QEMU processes of this server, want 1", found)
	}
}

// TestGracefulShutdownKeepsSandboxes is the SIGTERM variant of the restart.
func TestGracefulShutdownKeepsSandboxes(t *testing.T) {
	s := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	c := s.client()
	sb, err := c.Create(ctx, wire.CreateRequest{TemplateID: "base", Timeout: 1800})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	defer func() { _ = s.client().Kill(context.Background(), sb.SandboxID) }()
	s.Terminate(t)
	if st := s.ProcessState(); st == nil || !st.Success() {
		t.Errorf("serve after SIGTERM: %v, want exit 0", st)
	}
	s.Launch(t)
	c = s.client()
	r, err := c.Run(ctx, sb, "", "echo still-here")
	if err != nil || r.Stdout != "still-here\n" {
		t.Fatalf("run after graceful restart: %v %+v", err, r)
	}
	if err := c.Kill(ctx, sb.SandboxID); err != nil {
		t.Fatalf("kill: %v", err)
	}
	assertNoLeaks(t, s, sb.SandboxID)
}

// assertNoLeaks checks the host for remains of a killed sandbox: mounts,
// network namespaces, runc state and cgroups. Teardown is asynchronous in
// some designs, so each check gets a grace period before it fails.
func assertNoLeaks(t *testing.T, s *server, id string) {
	t.Helper()
	checks := []struct {
		what string
		find func() []string
	}{
		{"mounts mentioning the sandbox", func() []string {
			m, _ := mountsMatching(func(line string) bool { return strings.Contains(line, id) })
			return m
		}},
		{"network namespace files", func() []string { return netnsFiles(s.Instance, id) }},
		{"runc containers", func() []string { return runcContainers(s, id) }},
		{"cgroup directories", func() []string { return cgroupDirs(s, id) }},
	}
	for _, c := range checks {
		var left []string
		deadline := time.Now().Add(30 * time.Second)
		for {
			left = c.find()
			if len(left) == 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
		if len(left) > 0 {
			t.Errorf("sandbox %s killed but %s remain:\n  %s", id, c.what, strings.Join(left, "\n  "))
		}
	}
}

// TestNothingLeaksUnderDataDir runs last (file order): once every sandbox of
// this run is killed, nothing may stay mounted under the server's data dir.
func TestNothingLeaksUnderDataDir(t *testing.T) {
	s := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, key := range []string{s.APIKey, s.otherKey} {
		c := s.client()
		c.APIKey = key
		list, err := c.List(ctx, nil)
		if err != nil {
			t.Fatalf("list: %v", err)
		}
		for _, sb := range list {
			if err := c.Kill(ctx, sb.SandboxID); err != nil && !wire.IsStatus(err, 404) {
				t.Errorf("kill %s: %v", sb.SandboxID, err)
			}
			assertNoLeaks(t, s, sb.SandboxID)
		}
	}
	var left []string
	deadline := time.Now().Add(30 * time.Second)
	for {
		left, _ = harness.MountsUnder(s.DataDir)
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if len(left) > 0 {
		t.Errorf("no sandbox left, but mounted under %s:\n  %s", s.DataDir, strings.Join(left, "\n  "))
	}
}

// mountsMatching returns the mount points of /proc/self/mountinfo lines that
// match.
func mountsMatching(match func(line string) bool) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if match(line) {
			fields := strings.Fields(line)
			if len(fields) > 4 {
				out = append(out, fields[4])
			} else {
				out = append(out, line)
			}
		}
	}
	return out, sc.Err()
}

// netnsFiles lists sandbox id's netns pins: named by its network host key
// in the instance's netns dir, by its id anywhere else.
func netnsFiles(instance, id string) []string {
	names := []string{id}
	if key, err := network.HostKey("/run/"+instance+"/netns", id); err == nil {
		names = append(names, key)
	}
	var out []string
	for _, dir := range []string{"/run/netns", "/var/run/netns", "/run/" + instance + "/netns"} {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if slices.ContainsFunc(names, func(n string) bool { return strings.Contains(e.Name(), n) }) {
				out = append(out, filepath.Join(dir, e.Name()))
			}
		}
	}
	return out
}

// runcContainers lists sandbox id's runc containers, which are named by its
// host key.
func runcContainers(s *server, id string) []string {
	key, err := bundle.HostKey(filepath.Join(s.DataDir, "sandboxes"), id)
	if err != nil {
		return []string{"(no host key: " + err.Error() + ")"}
	}
	out, err := exec.Command("runc", "--root", "/run/"+s.Instance+"/runc", "list", "-q").Output()
	if err != nil {
		return nil // no state dir at all: nothing runs
	}
	var left []string
	for _, name := range strings.Fields(string(out)) {
		if name == key || strings.Contains(name, id) {
			left = append(left, name)
		}
	}
	return left
}

// cgroupDirs lists sandbox id's cgroup directories, which are named by its
// host key, not its id.
func cgroupDirs(s *server, id string) []string {
	key, err := bundle.HostKey(filepath.Join(s.DataDir, "sandboxes"), id)
	if err != nil {
		return []string{"(no host key: " + err.Error() + ")"}
	}
	var left []string
	for _, ctrl := range []string{"memory/", "pids/", "cpu/", "freezer/", "unified/", ""} {
		p := "/sys/fs/cgroup/" + ctrl + s.Instance + "/" + key
		if _, err := os.Stat(p); err == nil {
			left = append(left, p)
		}
	}
	return left
}
