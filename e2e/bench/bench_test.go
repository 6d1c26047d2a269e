// Package bench runs the bench's issue-14 table (bench/benchmark.RunAll)
// with tiny counts against a real server, so that the table cannot rot
// unnoticed: every target has its rows, and every row a figure, a floor
// measured in the same run and a ratio. It checks the table's shape, never
// its timings (those are the bench's to report).
package bench

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/agentbox/agentbox/bench/benchmark"
	"github.com/agentbox/agentbox/e2e/harness"
)

func TestAllTable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metrics := l.Addr().String()
	l.Close()
	s := harness.Start(t, harness.Args("--metrics-listen", metrics))
	// A warm pool for this run only: the teardown's plain start drains it.
	s.Restart(t, "--pool", "base=1", "--pool-max", "3")

	jsDir := filepath.Join(s.Root, "e2e", "js")
	harness.NPMInstall(t, jsDir)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	var out bytes.Buffer
	rows, err := benchmark.RunAll(ctx, benchmark.AllConfig{
		APIURL: s.URL, APIKey: s.APIKey, TemplateDir: s.TemplateDir, DataDir: s.DataDir, Instance: s.Instance, Bridge: s.Bridge,
		MetricsURL: "http://" + metrics + "/metrics",
		Creates:    2, Commands: 3, Burst: 2, SizeMB: 2, SizesMB: []int{10}, Cycles: 1, Forks: 2,
		DensityContainer: 2, DensityGVisor: 1, Parallel: 2,
		LargeFileMB: 8, JSDir: jsDir, SoakOps: 20,
		FullDisk: benchmark.ServerConfig{Bin: s.Bin, Envd: s.Envd, TemplateDir: s.TemplateDir, Instance: s.Instance + "-disk",
			Bridge: s.Bridge + "d", Subnet: diskSubnet(s.Subnet).String()},
	}, &out, slog.New(slog.NewTextHandler(testWriter{t}, nil)))
	t.Logf("table:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}

	// Rows per target: tiers, codings, sizes (pause and resume each, plus
	// the lazy resume), density (held and memory per tier), large files
	// (up, down, server and envd memory), the soak and the full disk
	// (target 0: host objects back to their baseline, 507s, nothing lost,
	// nothing left, which they must be).
	want := map[int]int{0: 1 + 8, 1: 2, 2: 2, 3: 2, 4: 2, 5: 2, 6: 3, 7: 1, 8: 4, 9: 4}
	got := map[int]int{}
	for _, r := range rows {
		got[r.Target]++
		if r.Target == 0 {
			if r.Err != "" || !r.Met || r.Value == "" {
				t.Errorf("%s: %s (floor %s), error %q: want a figure that meets its floor", r.Figure, r.Value, r.Floor, r.Err)
			}
			continue
		}
		switch {
		case r.Err != "":
			t.Errorf("target %d, %s: error: %s", r.Target, r.Figure, r.Err)
		case r.Value == "" || r.Floor == "" || !unicode.IsDigit(rune(r.Floor[0])):
			t.Errorf("target %d, %s: value %q, floor %q: want a figure and a numeric floor", r.Target, r.Figure, r.Value, r.Floor)
		case r.Ratio <= 0:
			t.Errorf("target %d, %s: ratio %v: want one", r.Target, r.Figure, r.Ratio)
		case r.Goal == "" || (r.Result() != "met" && r.Result() != "MISSED"):
			t.Errorf("target %d, %s: goal %q, result %q", r.Target, r.Figure, r.Goal, r.Result())
		}
	}
	for target, n := range want {
		if got[target] != n {
			t.Errorf("target %d: %d rows, want %d", target, got[target], n)
		}
	}
	// The printed table: a header, a line per row, the sections' times.
	text := out.String()
	for _, w := range []string{"#  FIGURE", "sections took: cold create (1)", "density (8)", "full disk: refusals", ", full disk "} {
		if !strings.Contains(text, w) {
			t.Errorf("printed table lacks %q", w)
		}
	}
	if n := strings.Count(text, "\n"); n < len(rows)+2 {
		t.Errorf("printed table has %d lines for %d rows", n, len(rows))
	}
}

// diskSubnet is the full-disk section's server's /24, beside the
// harness's own (10.160.0.0/12) in 10.176.0.0/12, so worktrees running
// this at once do not meet.
func diskSubnet(p netip.Prefix) netip.Prefix {
	a := p.Addr().As4()
	a[1] += 16
	return netip.PrefixFrom(netip.AddrFrom4(a), 24)
}

// testWriter sends the bench's log to t.Log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
