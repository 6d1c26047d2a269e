package benchmark

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/testutil"
)

func TestPct(t *testing.T) {
	ms := func(n ...int) []time.Duration {
		var out []time.Duration
		for _, v := range n {
			out = append(out, time.Duration(v)*time.Millisecond)
		}
		return out
	}
	tests := []struct {
		in   []time.Duration
		p    int
		want time.Duration
	}{
		{nil, 50, 0},
		{ms(7), 95, 7 * time.Millisecond},
		{ms(5, 1, 4, 2, 3), 50, 3 * time.Millisecond},
		{ms(5, 1, 4, 2, 3), 95, 5 * time.Millisecond},
		{ms(10, 9, 8, 7, 6, 5, 4, 3, 2, 1), 50, 5 * time.Millisecond},
	}
	for _, tt := range tests {
		if got := pct(tt.in, tt.p); got != tt.want {
			t.Errorf("pct(%v, %d) = %v, want %v", tt.in, tt.p, got, tt.want)
		}
	}
}

// TestRuncFloor runs the floor measurement on the rootfs in
// AGENTBOX_BENCH_ROOTFS, else on the machine's built base template. The
// rootfs is only read: it becomes the overlay's lower layer.
func TestRuncFloor(t *testing.T) {
	testutil.RequireRoot(t)
	layers := []string{os.Getenv("AGENTBOX_BENCH_ROOTFS")}
	if layers[0] == "" {
		var err error
		layers, err = templateLayers(context.Background(), "/var/cache/agentbox/templates", "base")
		if err != nil {
			t.Skipf("no rootfs: set AGENTBOX_BENCH_ROOTFS or build the base template (%v)", err)
		}
	}
	d, err := runcFloor(context.Background(), layers, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(d) != 2 {
		t.Fatalf("got %d samples, want 2", len(d))
	}
	t.Logf("runc floor: %v", d)
}

func TestParseSteps(t *testing.T) {
	text := `# HELP agentbox_sandbox_start_step_seconds x
agentbox_sandbox_start_step_seconds_bucket{path="create",step="start",le="0.1"} 1
agentbox_sandbox_start_step_seconds_sum{path="create",step="start"} 0.3
agentbox_sandbox_start_step_seconds_count{path="create",step="start"} 3
agentbox_sandbox_start_step_seconds_sum{path="create",step="attach network"} 0.06
agentbox_sandbox_start_step_seconds_count{path="create",step="attach network"} 3
agentbox_sandbox_start_step_seconds_sum{path="claim",step="start"} 9
agentbox_sandbox_start_step_seconds_count{path="claim",step="start"} 1
`
	after, err := parseSteps(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	before := stepTotals{"start": {sum: 0.1, count: 1}}
	rows := stepRows(before, after)
	if len(rows) != 2 || !strings.Contains(rows[0].metric, "start") || rows[0].value != "100ms" ||
		!strings.Contains(rows[1].metric, "attach network") || rows[1].value != "20ms" {
		t.Fatalf("rows %+v: want start 100ms (claim path ignored, the earlier scrape subtracted) then attach network 20ms", rows)
	}
}

// TestParsePoolMetrics: the pool's ready count, target and hits come from
// the operator's metrics of its template only (GET /pools leaves them 0
// for a team).
func TestParsePoolMetrics(t *testing.T) {
	text := `# HELP agentbox_pool_ready x
agentbox_pool_claims_total{result="hit",template="base"} 23
agentbox_pool_claims_total{result="miss",template="base"} 198
agentbox_pool_ready{template="base"} 21
agentbox_pool_ready{template="base-large"} 5
agentbox_pool_target{template="base"} 101
`
	p := poolStats{Template: "base", Min: 1}
	if err := parsePoolMetrics(strings.NewReader(text), &p); err != nil {
		t.Fatal(err)
	}
	if p.Ready != 21 || p.Target != 101 || p.Hits != 23 || p.Min != 1 {
		t.Fatalf("pool %+v: want ready 21, target 101, hits 23 of template base", p)
	}
}
