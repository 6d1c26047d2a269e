package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/bench/benchmark"
	"github.com/agentbox/agentbox/e2e/harness"
)

// largeFileRSSBoundKB is how much the server's and envd's peak RSS may be
// during a large transfer (above the server's RSS before it): a body held
// whole would take the file's size.
const largeFileRSSBoundKB = benchmark.LargeFileBoundKB

// TestLargeFile streams a file (E2E_LARGEFILE_MB MiB, default 1024) into a
// sandbox and back through the official e2b JS SDK and checks the bytes
// and that neither the server's nor envd's peak memory grew with the file.
// The bench (`go run ./bench --scenario largefile`) runs it at 5 GiB.
func TestLargeFile(t *testing.T) {
	s := need(t)
	mb := 1024
	if v := os.Getenv("E2E_LARGEFILE_MB"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("E2E_LARGEFILE_MB=%q: want a number of MiB", v)
		}
		mb = n
	}
	jsDir := filepath.Join(s.Root, "e2e", "js")
	harness.NPMInstall(t, jsDir)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	cfg := benchmark.LargeFileConfig{APIURL: s.URL, APIKey: s.APIKey, SizeMB: mb, JSDir: jsDir, ServerPID: s.PID(), FloorDir: s.DataDir}
	r, err := benchmark.LargeFile(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var table strings.Builder
	_ = benchmark.WriteTargets(&table, benchmark.LargeFileResultRows(cfg, r))
	t.Logf("the bench's rows:\n%s", table.String())
	t.Logf("%d MiB: upload %.0f MB/s, download %.0f MB/s (disk floor %.0f / %.0f MB/s); server RSS %d MiB, peak %d MiB; envd peak %d MiB",
		mb, r.Rate(r.Up), r.Rate(r.Down), r.Rate(r.FloorUp), r.Rate(r.FloorDown), r.ServerBeforeKB>>10, r.ServerPeakKB>>10, r.EnvdPeakKB>>10)
	if r.ServerPeakKB == 0 || r.EnvdPeakKB == 0 {
		t.Fatalf("no peak RSS read: server %d kB, envd %d kB", r.ServerPeakKB, r.EnvdPeakKB)
	}
	if grew := r.ServerPeakKB - r.ServerBeforeKB; grew > largeFileRSSBoundKB {
		t.Errorf("the server's peak RSS grew by %d MiB during a %d MiB transfer (bound %d MiB): something holds bodies", grew>>10, mb, largeFileRSSBoundKB>>10)
	}
	if r.EnvdPeakKB > largeFileRSSBoundKB {
		t.Errorf("envd's peak RSS is %d MiB after a %d MiB transfer (bound %d MiB): something holds bodies", r.EnvdPeakKB>>10, mb, largeFileRSSBoundKB>>10)
	}
}
