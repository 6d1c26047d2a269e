package benchmark

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/agentbox/agentbox/e2e/wire"
)

// Abuse is one way a sandbox can try to starve its neighbours: a script
// its root runs for about the given number of seconds.
type Abuse struct {
	Name   string
	Script func(secs int) string
}

// Abuses are the noisy neighbours of issue 11 (property 12): every CPU
// spinning, a fork bomb held at the pids limit, and memory allocated and
// touched past the memory limit over and over (each round ends in an OOM
// kill inside the sandbox's own cgroup).
func Abuses() []Abuse {
	return []Abuse{
		{"CPU spin", func(secs int) string {
			return fmt.Sprintf(`for i in $(seq $(($(nproc)*2))); do timeout %d sh -c 'while :; do :; done' & done; wait`, secs)
		}},
		{"fork bomb", func(secs int) string {
			return fmt.Sprintf(`timeout %d python3 -c "
import os, time
while True:
    try:
        if os.fork() == 0:
            time.sleep(5); os._exit(0)
    except OSError:
        time.sleep(0.001)
"; true`, secs)
		}},
		{"memory thrash", func(secs int) string {
			return fmt.Sprintf(`end=$(($(date +%%s)+%d)); while [ $(date +%%s) -lt $end ]; do timeout $((end-$(date +%%s)+1)) python3 -c "
a = []
while True:
    b = bytearray(16 << 20)
    for i in range(0, len(b), 4096):
        b[i] = 1
    a.append(b)
"; done; true`, secs)
		}},
	}
}

// Latency summarises round trips: median, 99th percentile and the worst.
type Latency struct {
	P50, P99, Worst time.Duration
	Samples, Errors int
}

func (l Latency) String() string {
	s := fmt.Sprintf("%s / %s / %s", round(l.P50), round(l.P99), round(l.Worst))
	if l.Errors > 0 {
		s += fmt.Sprintf(" (%d errors)", l.Errors)
	}
	return s
}

// EchoLatency runs `echo hi` in sb n times, one after another, and times
// each full round trip through the server (a failed one counts as its
// time, and as an error). Each call waits at most perCall.
func EchoLatency(ctx context.Context, c *wire.Client, sb *wire.Sandbox, n int, perCall time.Duration) Latency {
	var ds []time.Duration
	var errs int
	for range n {
		cctx, cancel := context.WithTimeout(ctx, perCall)
		start := time.Now()
		res, err := c.Run(cctx, sb, "", "echo hi")
		d := time.Since(start)
		cancel()
		if err != nil || strings.TrimSpace(res.Stdout) != "hi" {
			errs++
		}
		ds = append(ds, d)
	}
	l := Latency{P50: pct(ds, 50), P99: pct(ds, 99), Samples: n, Errors: errs}
	for _, d := range ds {
		l.Worst = max(l.Worst, d)
	}
	return l
}
