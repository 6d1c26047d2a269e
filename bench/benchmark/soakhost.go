package benchmark

import (
	"bufio"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/agentbox/agentbox/internal/runtime/bundle"
)

// HostScope names one server's share of the host, so counts taken while
// other servers run on the same host are this server's alone.
type HostScope struct {
	ServerPID int    // the serve process (0: server counts are -1)
	DataDir   string // its --data-dir
	Instance  string // its --instance: runc root under /run/<instance>, cgroup parent
	Bridge    string // its --bridge (veths are the bridge's ports)
	// MetricsURL and MetricsToken read go_goroutines from /metrics; empty:
	// goroutines are -1.
	MetricsURL, MetricsToken string
}

// HostSample is one look at the server and its host objects.
type HostSample struct {
	RSSMiB     int
	Goroutines int
	FDs        int
	DBKiB      int64 // agentbox.db with its WAL and shared memory
	Mounts     int   // mount points under the data dir and /run/<instance>
	Netns      int   // of them, pinned network namespaces (nsfs)
	Veths      int   // ports on the bridge
	Loops      int   // loop devices backed by files under the data dir
	Cgroups    int   // cgroups under the instance's parent (all hierarchies)
}

// HostHeader is the header line of HostSample.String.
func HostHeader() string {
	return fmt.Sprintf("%7s %5s %5s %8s %6s %5s %5s %5s %7s", "rssMiB", "gor", "fds", "dbKiB", "mounts", "netns", "veths", "loops", "cgroups")
}

func (h HostSample) String() string {
	return fmt.Sprintf("%7d %5d %5d %8d %6d %5d %5d %5d %7d", h.RSSMiB, h.Goroutines, h.FDs, h.DBKiB, h.Mounts, h.Netns, h.Veths, h.Loops, h.Cgroups)
}

// Objects is the host-object part of a sample: what must come back to
// its baseline once a workload's objects are gone.
func (h HostSample) Objects() [5]int {
	return [5]int{h.Mounts, h.Netns, h.Veths, h.Loops, h.Cgroups}
}

// Sample takes one HostSample; a count it cannot read is -1.
func (s HostScope) Sample() HostSample {
	h := HostSample{RSSMiB: -1, Goroutines: -1, FDs: -1}
	if s.ServerPID > 0 {
		proc := fmt.Sprintf("/proc/%d", s.ServerPID)
		if kb := statusField(proc+"/status", "VmRSS:"); kb >= 0 {
			h.RSSMiB = kb >> 10
		}
		if fds, err := os.ReadDir(proc + "/fd"); err == nil {
			h.FDs = len(fds)
		}
	}
	h.Goroutines = s.goroutines()
	for _, f := range []string{"agentbox.db", "agentbox.db-wal", "agentbox.db-shm"} {
		if st, err := os.Stat(filepath.Join(s.DataDir, f)); err == nil {
			h.DBKiB += st.Size() >> 10
		}
	}
	h.Mounts, h.Netns = s.mounts()
	if ports, err := os.ReadDir(filepath.Join("/sys/class/net", s.Bridge, "brif")); err == nil {
		h.Veths = len(ports)
	}
	h.Loops = s.loops()
	h.Cgroups = s.cgroups()
	return h
}

func statusField(path, field string) int {
	f, err := os.Open(path)
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), field); ok {
			n, err := strconv.Atoi(strings.Fields(rest)[0])
			if err == nil {
				return n
			}
		}
	}
	return -1
}

func (s HostScope) goroutines() int {
	if s.MetricsURL == "" {
		return -1
	}
	req, err := http.NewRequest(http.MethodGet, s.MetricsURL, nil)
	if err != nil {
		return -1
	}
	if s.MetricsToken != "" {
		req.Header.Set("Authorization", "Bearer "+s.MetricsToken)
	}
	cl := http.Client{Timeout: 10 * time.Second}
	resp, err := cl.Do(req)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "go_goroutines "); ok {
			if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
				return int(f)
			}
		}
	}
	return -1
}

// under reports whether p is dir or below it.
func under(p, dir string) bool {
	return dir != "" && (p == dir || strings.HasPrefix(p, dir+"/"))
}

func (s HostScope) mounts() (mounts, netns int) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return -1, -1
	}
	run := ""
	if s.Instance != "" {
		run = "/run/" + s.Instance
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 || (!under(f[4], s.DataDir) && !under(f[4], run)) || f[4] == s.DataDir {
			continue // the data dir itself may be a filesystem of its own
		}
		mounts++
		for i, x := range f {
			if x == "-" && i+1 < len(f) && f[i+1] == "nsfs" {
				netns++
			}
		}
	}
	return mounts, netns
}

func (s HostScope) loops() int {
	devs, err := filepath.Glob("/sys/block/loop*/loop/backing_file")
	if err != nil {
		return -1
	}
	// The disk pool's ready disks (--disk-pool) are the server's own, made
	// ahead of creates: a fixed number, not the workload's. One whose file
	// is gone is a leak like any other.
	pool := filepath.Join(s.DataDir, bundle.DiskPoolDirName)
	n := 0
	for _, d := range devs {
		b, err := os.ReadFile(d)
		file := strings.TrimSpace(string(b))
		if err == nil && under(file, s.DataDir) && (!under(file, pool) || strings.HasSuffix(file, "(deleted)")) {
			n++
		}
	}
	return n
}

func (s HostScope) cgroups() int {
	if s.Instance == "" {
		return -1
	}
	roots, _ := filepath.Glob("/sys/fs/cgroup/*/" + s.Instance)
	if st, err := os.Stat("/sys/fs/cgroup/" + s.Instance); err == nil && st.IsDir() {
		roots = append(roots, "/sys/fs/cgroup/"+s.Instance)
	}
	n := 0
	for _, r := range roots {
		_ = filepath.WalkDir(r, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() && p != r {
				n++
			}
			return nil
		})
	}
	return n
}
