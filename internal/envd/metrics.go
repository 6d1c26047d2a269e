package envd

import (
	"bufio"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Metrics is the body of GET /metrics; the sandbox's own cgroup is the
// source, so numbers describe the sandbox, not the host.
type Metrics struct {
	Timestamp   int64   `json:"ts"`
	CPUCount    int     `json:"cpu_count"`
	CPUUsedPct  float64 `json:"cpu_used_pct"`
	MemTotal    uint64  `json:"mem_total"`
	MemUsed     uint64  `json:"mem_used"`
	MemCache    uint64  `json:"mem_cache"`
	MemTotalMiB uint64  `json:"mem_total_mib"`
	MemUsedMiB  uint64  `json:"mem_used_mib"`
	DiskUsed    uint64  `json:"disk_used"`
	DiskTotal   uint64  `json:"disk_total"`
}

// metricsSampler remembers the previous CPU reading to turn cumulative
// usage into a percentage.
type metricsSampler struct {
	cgroupRoot string // /sys/fs/cgroup
	procRoot   string // /proc

	mu       sync.Mutex
	lastAt   time.Time
	lastUsec uint64
}

func newMetricsSampler() *metricsSampler {
	return &metricsSampler{cgroupRoot: "/sys/fs/cgroup", procRoot: "/proc"}
}

func (s *Server) handleMetrics(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.metrics.sample(time.Now()))
}

func (m *metricsSampler) sample(now time.Time) Metrics {
	out := Metrics{Timestamp: now.Unix(), CPUCount: runtime.NumCPU()}
	hostMem := m.hostMemTotal()
	out.MemTotal = hostMem

	cg := m.cgroupPaths()
	var usageUsec, v2Usec uint64
	var haveCPU, haveV2CPU bool
	if p, ok := cg[""]; ok { // cgroup v2 unified
		dir := filepath.Join(m.cgroupRoot, p)
		if v2 := filepath.Join(m.cgroupRoot, "unified", p); !exists(filepath.Join(dir, "cgroup.controllers")) && exists(v2) {
			dir = v2
		}
		if lim, ok := readUint(filepath.Join(dir, "memory.max")); ok && lim > 0 && lim < hostMem {
			out.MemTotal = lim
		}
		if cur, ok := readUint(filepath.Join(dir, "memory.current")); ok {
			out.MemUsed = cur
		}
		stat := readKV(filepath.Join(dir, "memory.stat"))
		out.MemCache = stat["file"]
		if cpu := readKV(filepath.Join(dir, "cpu.stat")); cpu != nil {
			v2Usec, haveV2CPU = cpu["usage_usec"], true
		}
		if b, err := os.ReadFile(filepath.Join(dir, "cpu.max")); err == nil {
			f := strings.Fields(string(b))
			if len(f) == 2 && f[0] != "max" {
				out.CPUCount = cpusFromQuota(f[0], f[1], out.CPUCount)
			}
		}
	}
	if p, ok := cg["memory"]; ok && out.MemUsed == 0 {
		dir := filepath.Join(m.cgroupRoot, "memory", p)
		if lim, ok := readUint(filepath.Join(dir, "memory.limit_in_bytes")); ok && lim > 0 && lim < hostMem {
			out.MemTotal = lim
		}
		if cur, ok := readUint(filepath.Join(dir, "memory.usage_in_bytes")); ok {
			out.MemUsed = cur
		}
		stat := readKV(filepath.Join(dir, "memory.stat"))
		out.MemCache = stat["total_cache"]
		if out.MemCache == 0 {
			out.MemCache = stat["cache"]
		}
	}
	for _, ctrl := range []string{"cpuacct", "cpu,cpuacct", "cpu"} {
		if haveCPU {
			break
		}
		if _, err := os.Stat(filepath.Join(m.cgroupRoot, ctrl)); err != nil {
			continue
		}
		p, ok := cg[ctrl]
		if !ok {
			continue
		}
		dir := filepath.Join(m.cgroupRoot, ctrl, p)
		if ns, ok := readUint(filepath.Join(dir, "cpuacct.usage")); ok {
			usageUsec, haveCPU = ns/1000, true
		}
		q, errQ := os.ReadFile(filepath.Join(dir, "cpu.cfs_quota_us"))
		per, errP := os.ReadFile(filepath.Join(dir, "cpu.cfs_period_us"))
		if errQ == nil && errP == nil {
			out.CPUCount = cpusFromQuota(strings.TrimSpace(string(q)), strings.TrimSpace(string(per)), out.CPUCount)
		}
	}
	// On hybrid hosts v1 cpuacct is authoritative; v2 is used when alone.
	if !haveCPU && haveV2CPU {
		usageUsec, haveCPU = v2Usec, true
	}
	if out.MemCache > out.MemUsed {
		out.MemCache = out.MemUsed
	}
	out.MemTotalMiB = out.MemTotal >> 20
	out.MemUsedMiB = out.MemUsed >> 20

	if haveCPU {
		m.mu.Lock()
		if !m.lastAt.IsZero() && now.After(m.lastAt) && usageUsec >= m.lastUsec {
			elapsed := float64(now.Sub(m.lastAt).Microseconds()) * float64(out.CPUCount)
			if elapsed > 0 {
				out.CPUUsedPct = float64(usageUsec-m.lastUsec) / elapsed * 100
			}
		}
		m.lastAt, m.lastUsec = now, usageUsec
		m.mu.Unlock()
	}

	var st unix.Statfs_t
	if err := unix.Statfs("/", &st); err == nil {
		out.DiskTotal = st.Blocks * uint64(st.Bsize)
		out.DiskUsed = (st.Blocks - st.Bfree) * uint64(st.Bsize)
	}
	return out
}

func cpusFromQuota(quota, period string, def int) int {
	q, err1 := strconv.ParseFloat(quota, 64)
	p, err2 := strconv.ParseFloat(period, 64)
	if err1 != nil || err2 != nil || q <= 0 || p <= 0 {
		return def
	}
	n := int((q + p - 1) / p)
	if n < 1 {
		n = 1
	}
	if n > def {
		return def
	}
	return n
}

// cgroupPaths parses /proc/self/cgroup into controller → path ("" for the
// v2 unified hierarchy). Inside a cgroup namespace paths are "/".
func (m *metricsSampler) cgroupPaths() map[string]string {
	f, err := os.Open(filepath.Join(m.procRoot, "self", "cgroup"))
	if err != nil {
		return nil
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[1] == "" {
			out[""] = parts[2]
			continue
		}
		out[parts[1]] = parts[2]
		for _, c := range strings.Split(parts[1], ",") {
			out[c] = parts[2]
		}
	}
	return out
}

func (m *metricsSampler) hostMemTotal() uint64 {
	kv := readKV(filepath.Join(m.procRoot, "meminfo"))
	return kv["MemTotal:"] * 1024
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

func readUint(p string) (uint64, bool) {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	return n, err == nil
}

// readKV parses "key value" lines; nil if the file is unreadable.
func readKV(p string) map[string]uint64 {
	b, err := os.ReadFile(p)
	if err != nil {
		return nil
	}
	out := map[string]uint64{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 {
			if n, err := strconv.ParseUint(f[1], 10, 64); err == nil {
				out[f[0]] = n
			}
		}
	}
	return out
}
