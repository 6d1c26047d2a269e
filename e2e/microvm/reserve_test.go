package microvm

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/bench/benchmark"
	"github.com/agentbox/agentbox/e2e/harness"
	"github.com/agentbox/agentbox/e2e/wire"
)

// TestControlPlaneReserve: the guest's own kernel enforces the sandbox's
// pids and memory on the user cgroup, which holds every command, less
// envd's reserve; a fork bomb fills the user cgroup and its owner still
// kills it and runs a command. (The container tiers' rows are in
// e2e/outside TestControlPlaneReserve.)
func TestControlPlaneReserve(t *testing.T) {
	s := harness.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Minute)
	defer cancel()
	// A team whose sandboxes have 512 tasks: under TCG a bomb of the
	// default 4096 takes minutes to fill the guest.
	key := s.NewKey(t, "vmreserve")
	if out, err := exec.CommandContext(ctx, s.Bin, "team", "quota", "set", "vmreserve", "--pids", "512", "--data-dir", s.DataDir).CombinedOutput(); err != nil {
		t.Fatalf("team quota set: %v\n%s", err, out)
	}
	c := wire.New(s.URL, key)
	sb, err := c.Create(ctx, wire.CreateRequest{TemplateID: "base", Timeout: 900, Metadata: map[string]string{"agentbox.isolation": "microvm"}})
	if err != nil {
		t.Fatalf("create a microvm sandbox: %v\nserver log:\n%s", err, s.LogTail(40))
	}
	defer func() { _ = c.Kill(context.Background(), sb.SandboxID) }()
	r, err := c.Run(ctx, sb, "root", "cat /proc/self/cgroup /sys/fs/cgroup/user/pids.max /sys/fs/cgroup/user/memory.max")
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("read the guest's cgroups: %+v %v", r, err)
	}
	lines := strings.Fields(r.Stdout)
	if len(lines) != 3 || lines[0] != "0::/user" || lines[1] == "max" || lines[2] == "max" {
		t.Fatalf("a command's cgroup and the user cgroup's limits: %q, want 0::/user and two limits", r.Stdout)
	}
	t.Logf("guest user cgroup: pids.max %s, memory.max %s", lines[1], lines[2])
	// TCG emulates every guest instruction: the deadlines are generous.
	took, err := benchmark.RecoverFromForkBomb(ctx, c, sb, 5*time.Minute, time.Minute)
	if err != nil {
		t.Fatalf("fork bomb in a microVM: %v\nserver log:\n%s", err, s.LogTail(40))
	}
	t.Logf("the owner's echo ran again %s after the kill", took.Round(time.Millisecond))
}
