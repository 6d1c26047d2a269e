package benchmark

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
)

// Machine describes the host a table was measured on: CPU, cores, memory,
// kernel, the raw parts' versions and the load average.
func Machine(ctx context.Context, criu string) string {
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	kernel := "unknown kernel"
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		kernel = strings.TrimSpace(string(b))
	}
	version := func(bin string, args ...string) string {
		out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
		if err != nil {
			return bin + ": " + firstLine(err.Error())
		}
		return firstLine(strings.TrimSpace(string(out)))
	}
	return fmt.Sprintf("machine: %s, %d cores, %.1f GiB RAM, Linux %s; %s; %s; criu %s; load average %s",
		model, runtime.NumCPU(), float64(memInfo("MemTotal"))/(1<<30), kernel,
		version("runc", "--version"), version("runsc", "--version"), version(criu, "--version"), LoadAvg())
}

// LoadAvg is the 1, 5 and 15 minute load averages.
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
