package benchmark

import (
	"context"
	"os"
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
