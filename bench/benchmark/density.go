package benchmark

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/agentbox/agentbox/e2e/wire"
)

// DensityConfig configures RunDensity.
type DensityConfig struct {
	APIURL, APIKey string
	Template       string
	Tier           string // isolation tier: container or gvisor
	N              int    // idle sandboxes to hold at once
	Parallel       int    // creates, commands and kills in flight; default 8
	DataDir        string // the server's --data-dir
	Instance       string // the server's --instance
	Bridge         string // the server's --bridge
	ServerPID      int    // 0: the process listening on the API port
	MinFreeMiB     int    // stop creating below this much MemAvailable; 0: never
}

// RunDensity holds N idle sandboxes of one tier at once, measured rather
// than extrapolated: it creates them, checks that each answers a command,
// prints the server's memory and the host memory each sandbox costs, then
// kills them all and checks that the server left nothing behind (network
// namespaces, veths, runc state, cgroups and their tasks, mounts, files
// under the data dir, nftables elements). When creates start failing it
// stops and prints the first error: what ran out.
func RunDensity(ctx context.Context, cfg DensityConfig, w io.Writer, log *slog.Logger) error {
	if cfg.Template == "" {
		cfg.Template = "base"
	}
	if cfg.Tier == "" {
		cfg.Tier = "container"
	}
	if cfg.Parallel <= 0 {
		cfg.Parallel = 8
	}
	if cfg.Instance == "" || cfg.DataDir == "" {
		return fmt.Errorf("density: --instance and --data-dir name the server's host state to check")
	}
	c := wire.New(cfg.APIURL, cfg.APIKey)
	if err := c.Health(ctx); err != nil {
		return fmt.Errorf("server at %s: %w", cfg.APIURL, err)
	}
	pid := cfg.ServerPID
	if pid == 0 {
		pid = listenerPID(cfg.APIURL)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "METRIC\tVALUE\tNOTE")
	before := hostState(cfg)
	dropCaches()
	memBefore := memInfo("MemAvailable")
	rssBefore, thrBefore, fdBefore := procStats(pid)

	// Create.
	start := time.Now()
	sbs, firstErr := createIdle(ctx, c, cfg, cfg.Tier, cfg.N, log)
	created := time.Since(start)
	fmt.Fprintf(tw, "%s: idle sandboxes held at once\t%d of %d\tcreated in %s, %d in flight\n", cfg.Tier, len(sbs), cfg.N, created.Round(time.Second), cfg.Parallel)
	if firstErr != nil {
		fmt.Fprintf(tw, "%s: what ran out (first failed create)\t%s\t\n", cfg.Tier, firstLine(firstErr.Error()))
	}

	// Each answers a command.
	answered, cmdErr := answerAll(ctx, c, sbs, cfg.Parallel)
	fmt.Fprintf(tw, "%s: answered `echo ok`\t%d of %d\t\n", cfg.Tier, answered, len(sbs))
	if cmdErr != nil {
		fmt.Fprintf(tw, "%s: first failed command\t%s\t\n", cfg.Tier, firstLine(cmdErr.Error()))
	}

	// Memory, idle.
	time.Sleep(5 * time.Second)
	dropCaches()
	memAfter := memInfo("MemAvailable")
	rssAfter, thrAfter, fdAfter := procStats(pid)
	held := hostState(cfg)
	if n := float64(len(sbs)); n > 0 {
		per := 0.0
		if memBefore > memAfter {
			per = float64(memBefore-memAfter) / n
		}
		fmt.Fprintf(tw, "%s: host memory per idle sandbox\t%.1f MiB\tMemAvailable drop %.0f MiB / %d, page cache dropped before and after (other work on a shared host counts too)\n", cfg.Tier, per/(1<<20), float64(memBefore-min(memBefore, memAfter))/(1<<20), len(sbs))
		fmt.Fprintf(tw, "%s: server RSS before → holding\t%.1f MiB → %.1f MiB\t%.1f KiB per sandbox\n", cfg.Tier, float64(rssBefore)/1024, float64(rssAfter)/1024, float64(rssAfter-rssBefore)/n)
		fmt.Fprintf(tw, "%s: server threads, open files before → holding\t%d → %d, %d → %d\t\n", cfg.Tier, thrBefore, thrAfter, fdBefore, fdAfter)
		fmt.Fprintf(tw, "%s: host processes per idle sandbox\t%.1f\tprocesses in the instance's cgroups / sandboxes\n", cfg.Tier, float64(held["processes in the instance's cgroups"]-before["processes in the instance's cgroups"])/n)
	}

	// Kill all, then nothing may be left.
	start = time.Now()
	killErrs := killEach(ctx, c, sbs, cfg.Parallel, log)
	fmt.Fprintf(tw, "%s: kill all\t%s\t%d errors\n", cfg.Tier, time.Since(start).Round(time.Second), killErrs)
	after := waitClean(cfg, before, 60*time.Second)
	keys := make([]string, 0, len(before))
	for k := range before {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		verdict := "nothing left"
		if after[k] != before[k] {
			verdict = fmt.Sprintf("LEFT BEHIND: %+d", after[k]-before[k])
		}
		fmt.Fprintf(tw, "%s: after kill, %s\t%d → %d → %d\t%s\n", cfg.Tier, k, before[k], held[k], after[k], verdict)
	}
	return tw.Flush()
}

// createIdle creates n idle sandboxes of tier, cfg.Parallel at a time. It
// stops at the fifth failure or when the host's MemAvailable falls below
// cfg.MinFreeMiB, and returns the first error: what ran out.
func createIdle(ctx context.Context, c *wire.Client, cfg DensityConfig, tier string, n int, log *slog.Logger) ([]*wire.Sandbox, error) {
	var (
		mu       sync.Mutex
		sbs      []*wire.Sandbox
		firstErr error
		failures atomic.Int32
		wg       sync.WaitGroup
	)
	start := time.Now()
	sem := make(chan struct{}, max(1, cfg.Parallel))
	for i := range n {
		if failures.Load() >= 5 || ctx.Err() != nil {
			break
		}
		// Other work shares the host: stop before the kernel's OOM
		// killer would pick a victim.
		if avail := memInfo("MemAvailable"); cfg.MinFreeMiB > 0 && avail < uint64(cfg.MinFreeMiB)<<20 {
			mu.Lock()
			if firstErr == nil {
				firstErr = fmt.Errorf("host memory: MemAvailable %d MiB is below --min-free-mib %d after %d creates", avail>>20, cfg.MinFreeMiB, i)
			}
			mu.Unlock()
			break
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			sb, err := c.Create(ctx, wire.CreateRequest{TemplateID: cfg.Template, Timeout: 3600, Metadata: map[string]string{"agentbox.isolation": tier, "bench": "density"}})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if firstErr == nil {
					firstErr = fmt.Errorf("create %d: %w", i+1, err)
				}
				failures.Add(1)
				return
			}
			sbs = append(sbs, sb)
			if len(sbs)%100 == 0 {
				log.Info("density", "tier", tier, "created", len(sbs), "elapsed", time.Since(start).Round(time.Second))
			}
		})
	}
	wg.Wait()
	return sbs, firstErr
}

// answerAll runs `echo ok` in every sandbox, parallel at a time, and
// counts the right answers.
func answerAll(ctx context.Context, c *wire.Client, sbs []*wire.Sandbox, parallel int) (int, error) {
	var (
		answered atomic.Int32
		mu       sync.Mutex
		cmdErr   error
		wg       sync.WaitGroup
	)
	sem := make(chan struct{}, max(1, parallel))
	for _, sb := range sbs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			r, err := c.Run(ctx, sb, "", "echo ok")
			if err == nil && r.Stdout != "ok\n" {
				err = fmt.Errorf("echo ok printed %q", r.Stdout)
			}
			if err != nil {
				mu.Lock()
				if cmdErr == nil {
					cmdErr = fmt.Errorf("%s: %w", sb.SandboxID, err)
				}
				mu.Unlock()
				return
			}
			answered.Add(1)
		})
	}
	wg.Wait()
	return int(answered.Load()), cmdErr
}

// killEach kills every sandbox, parallel at a time, and counts the
// failures.
func killEach(ctx context.Context, c *wire.Client, sbs []*wire.Sandbox, parallel int, log *slog.Logger) int {
	var errs atomic.Int32
	var wg sync.WaitGroup
	sem := make(chan struct{}, max(1, parallel))
	for _, sb := range sbs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := c.Kill(ctx, sb.SandboxID); err != nil {
				errs.Add(1)
				log.Warn("kill", "id", sb.SandboxID, "err", err)
			}
		})
	}
	wg.Wait()
	return int(errs.Load())
}

// waitClean waits up to timeout for the host state to be back to before,
// and returns the last state seen.
func waitClean(cfg DensityConfig, before map[string]int, timeout time.Duration) map[string]int {
	deadline := time.Now().Add(timeout)
	for {
		after := hostState(cfg)
		if equalState(before, after) || time.Now().After(deadline) {
			return after
		}
		time.Sleep(time.Second)
	}
}

// leftBehind names what after holds more of than before (a warm pool
// shrinking meanwhile leaves fewer).
func leftBehind(before, after map[string]int) []string {
	var out []string
	for k, v := range before {
		if after[k] > v {
			out = append(out, fmt.Sprintf("%s %+d", k, after[k]-v))
		}
	}
	sort.Strings(out)
	return out
}

func equalState(a, b map[string]int) bool {
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// hostState counts the server instance's per-sandbox host objects.
func hostState(cfg DensityConfig) map[string]int {
	run := filepath.Join("/run", cfg.Instance)
	st := map[string]int{}
	st["network namespaces"] = countEntries(filepath.Join(run, "netns"))
	st["runc/runsc state"] = countEntries(filepath.Join(run, "runc")) + countEntries(filepath.Join(run, "runc-runsc")) + countEntries(filepath.Join(run, "runc-idmap"))
	if cfg.Bridge != "" {
		st["veths on the bridge"] = countEntries(filepath.Join("/sys/class/net", cfg.Bridge, "brif"))
		// Past 1,000 sandboxes the server adds bridges named <bridge>-N.
		over, _ := filepath.Glob(filepath.Join("/sys/class/net", cfg.Bridge+"-[0-9]*"))
		st["overflow bridges"] = len(over)
		for _, br := range over {
			st["veths on the bridge"] += countEntries(filepath.Join(br, "brif"))
		}
	}
	cg := 0
	for _, root := range []string{"/sys/fs/cgroup/pids", "/sys/fs/cgroup/memory", "/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
		dir := filepath.Join(root, cfg.Instance)
		_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() && p != dir {
				cg++
			}
			return nil
		})
	}
	st["cgroups"] = cg
	tasks := 0
	for _, root := range []string{"/sys/fs/cgroup/pids", "/sys/fs/cgroup"} {
		dir := filepath.Join(root, cfg.Instance)
		_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() && d.Name() == "cgroup.procs" {
				if b, err := os.ReadFile(p); err == nil {
					tasks += len(strings.Fields(string(b)))
				}
			}
			return nil
		})
	}
	st["processes in the instance's cgroups"] = tasks
	st["mounts under /run/<instance> and the data dir"] = countMounts(run) + countMounts(cfg.DataDir)
	st["entries in <data dir>/sandboxes"] = countEntries(filepath.Join(cfg.DataDir, "sandboxes"))
	st["nftables set/map elements"] = nftElements("inet", cfg.Instance) + nftElements("bridge", cfg.Instance)
	return st
}

func countEntries(dir string) int {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	return len(ents)
}

func countMounts(dir string) int {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return 0
	}
	n := 0
	for line := range strings.SplitSeq(string(b), "\n") {
		// null-netns is the gVisor driver's one empty netns for restores,
		// pinned for the server's life, not a sandbox's.
		if f := strings.Fields(line); len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) && filepath.Base(f[4]) != "null-netns" {
			n++
		}
	}
	return n
}

// nftElements counts the elements of every set and map of one table.
func nftElements(family, table string) int {
	out, err := exec.Command("nft", "-j", "list", "table", family, table).Output()
	if err != nil {
		return 0
	}
	var doc struct {
		Nftables []map[string]json.RawMessage `json:"nftables"`
	}
	if json.NewDecoder(bytes.NewReader(out)).Decode(&doc) != nil {
		return 0
	}
	n := 0
	for _, obj := range doc.Nftables {
		for _, kind := range []string{"set", "map"} {
			if raw, ok := obj[kind]; ok {
				var s struct {
					Elem []json.RawMessage `json:"elem"`
				}
				if json.Unmarshal(raw, &s) == nil {
					n += len(s.Elem)
				}
			}
		}
	}
	return n
}

// procStats is a process's RSS (KiB), threads and open files.
func procStats(pid int) (rssKiB int64, threads, fds int) {
	if pid <= 0 {
		return 0, 0, 0
	}
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "VmRSS:" {
			rssKiB, _ = strconv.ParseInt(f[1], 10, 64)
		}
		if len(f) >= 2 && f[0] == "Threads:" {
			threads, _ = strconv.Atoi(f[1])
		}
	}
	return rssKiB, threads, countEntries(fmt.Sprintf("/proc/%d/fd", pid))
}
