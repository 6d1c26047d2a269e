package benchmark

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestTargetRows(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name      string
		row       TargetRow
		ratio     float64
		result    string
		printedAs []string
	}{
		{"within the bound", atMost(1, "create", 110*ms, 100*ms, 1.2), 1.1, "met", []string{"110ms", "100ms", "1.10x", "≤ 1.2x", "met"}},
		{"over the bound", atMost(2, "cpu", 200*ms, 100*ms, 1.5), 2, "MISSED", []string{"2.00x", "≤ 1.5x", "MISSED"}},
		{"no floor", atMost(4, "rtt", 10*ms, 0, 1.5), 0, "ERROR", []string{"error: no floor measured"}},
		{"absolute bound met, ratio for scale", below(3, "claim", 5*ms, 500*time.Microsecond, 10*ms), 10, "met", []string{"5ms", "500µs", "10.00x", "< 10ms"}},
		{"absolute bound missed", below(3, "burst", 2*time.Second, 40*ms, time.Second), 50, "MISSED", []string{"< 1s", "MISSED"}},
		{"failed part", failed(6, "pause", errors.New("criu dump: exit status 1\nmore")), 0, "ERROR", []string{"error: criu dump: exit status 1", "ERROR"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.row.Ratio != tt.ratio || tt.row.Result() != tt.result {
				t.Errorf("ratio %v, result %s; want %v, %s", tt.row.Ratio, tt.row.Result(), tt.ratio, tt.result)
			}
			var b strings.Builder
			if err := WriteTargets(&b, []TargetRow{tt.row}); err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
			if len(lines) != 2 || !strings.HasPrefix(lines[0], "#") {
				t.Fatalf("printed %q: want a header and one row", b.String())
			}
			for _, w := range tt.printedAs {
				if !strings.Contains(lines[1], w) {
					t.Errorf("row %q lacks %q", lines[1], w)
				}
			}
		})
	}
}

func TestLeftBehind(t *testing.T) {
	before := map[string]int{"cgroups": 3, "veths on the bridge": 10, "mounts": 0}
	after := map[string]int{"cgroups": 3, "veths on the bridge": 8, "mounts": 2}
	got := leftBehind(before, after)
	if len(got) != 1 || got[0] != "mounts +2" {
		t.Fatalf("leftBehind = %v, want [mounts +2] (fewer veths, a pool shrinking, is nothing left)", got)
	}
}

func TestCause(t *testing.T) {
	long := "create 23: POST /v2/sandboxes: 500 " + strings.Repeat("x", 400) + ": create veth: exchange full"
	tests := []struct{ in, wantPrefix, wantSuffix string }{
		{"short\nsecond line", "short", "short"},
		{long, "create 23: POST", "create veth: exchange full"},
	}
	for _, tt := range tests {
		got := cause(errors.New(tt.in))
		if !strings.HasPrefix(got, tt.wantPrefix) || !strings.HasSuffix(got, tt.wantSuffix) || len(got) > 310 {
			t.Errorf("cause(%.40q…) = %q: want %q … %q, at most about 300 bytes", tt.in, got, tt.wantPrefix, tt.wantSuffix)
		}
	}
}
