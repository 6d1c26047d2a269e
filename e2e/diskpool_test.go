package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/wire"
)

// TestDiskPoolFreshDisks: with the disk pool on (--disk-pool, the
// default), a create takes a disk made ahead (its image moves from the
// pool into the sandbox's bundle), and that disk is fresh: what the
// sandbox before it wrote is not there, and the disk limit still bounds it.
func TestDiskPoolFreshDisks(t *testing.T) {
	s := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := s.client()
	create := func() *wire.Sandbox {
		t.Helper()
		sb, err := c.Create(ctx, wire.CreateRequest{TemplateID: "base", Timeout: 300})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Kill(context.Background(), sb.SandboxID) })
		return sb
	}
	run := func(sb *wire.Sandbox, cmd string) string {
		t.Helper()
		res, err := c.Run(ctx, sb, "root", cmd)
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("%s: %+v %v", cmd, res, err)
		}
		return res.Stdout
	}
	inodes := func(glob string) map[uint64]bool {
		out := map[uint64]bool{}
		files, _ := filepath.Glob(glob)
		for _, f := range files {
			if fi, err := os.Stat(f); err == nil {
				out[fi.Sys().(*syscall.Stat_t).Ino] = true
			}
		}
		return out
	}
	pool := filepath.Join(s.DataDir, "disk-pool", "*.img")

	a := create() // starts the pool if nothing did yet
	run(a, "echo from-a > /home/user/a-was-here && echo from-a > /root/a-was-here && sync")
	var ready map[uint64]bool
	for deadline := time.Now().Add(2 * time.Minute); len(ready) == 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the disk pool never had a disk ready")
		}
		ready = inodes(pool)
	}
	b := create()
	took := false
	for ino := range inodes(filepath.Join(s.DataDir, "sandboxes", "*", "disk.img")) {
		took = took || ready[ino]
	}
	if !took {
		t.Fatal("no sandbox's disk came from the pool")
	}
	if out := run(b, "ls -A /home/user /root; test ! -e /home/user/a-was-here && test ! -e /root/a-was-here && echo fresh"); !strings.Contains(out, "fresh") {
		t.Fatalf("the next sandbox sees the previous one's files: %q", out)
	}
	// Its own filesystem of the sandbox's disk size, not the host's.
	hostFS := run(b, "df -P / | awk 'NR==2 {print $2}'")
	var st syscall.Statfs_t
	if err := syscall.Statfs(s.DataDir, &st); err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(hostFS) == "" || strings.TrimSpace(hostFS) == strconv.FormatUint(st.Blocks*uint64(st.Bsize)/1024, 10) {
		t.Fatalf("the sandbox's / reports %q KiB, the host's data disk's size", hostFS)
	}
}
