package benchmark

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agentbox/agentbox/e2e/wire"
	"github.com/agentbox/agentbox/internal/hostkey"
	"github.com/agentbox/agentbox/internal/runtime/bundle"
)

// The create-under-load rows: host CPU per create against `runc run
// /bin/true`'s, a burst of cold creates (latency, wall time against the
// CPU floor, failures, leaks), and with a warm pool on the server a burst
// the pool absorbs and single claims.

// coldMeta is the metadata of a create that must start cold even on a
// server with a warm pool: naming the default tier explicitly makes the
// same sandbox, which the pool does not serve (it serves requests that
// leave every choice to the template).
func coldMeta(kind string) map[string]string {
	return map[string]string{"bench": kind, "agentbox.isolation": "container"}
}

// clockTick is the unit of /proc/<pid>/stat's CPU times (USER_HZ, 100 on
// every Linux ABI Go supports).
const clockTick = 10 * time.Millisecond

// procCPU is the CPU time of pid and of its children it has waited for
// (runc, hooks): utime, stime, cutime and cstime of /proc/<pid>/stat.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// Fields after the command name, which is in parentheses and may hold
	// spaces: state is field 3, utime field 14.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 15 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	var ticks int64
	for _, v := range f[11:15] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, err
		}
		ticks += n
	}
	return time.Duration(ticks) * clockTick, nil
}

// sandboxCPU is the CPU time charged to sandbox id's cgroup (v1 cpuacct,
// or v2 cpu.stat), found under any parent by its host key.
func sandboxCPU(dataDir, id string) (time.Duration, error) {
	key, err := bundle.HostKey(filepath.Join(dataDir, "sandboxes"), id)
	if err != nil {
		return 0, fmt.Errorf("host key of %s (pass the server's --data-dir): %w", id, err)
	}
	if m, _ := filepath.Glob("/sys/fs/cgroup/cpuacct/*/" + key + "/cpuacct.usage"); len(m) > 0 {
		b, err := os.ReadFile(m[0])
		if err != nil {
			return 0, err
		}
		ns, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		return time.Duration(ns), err
	}
	if m, _ := filepath.Glob("/sys/fs/cgroup/*/" + key + "/cpu.stat"); len(m) > 0 {
		b, err := os.ReadFile(m[0])
		if err != nil {
			return 0, err
		}
		for line := range strings.Lines(string(b)) {
			if f := strings.Fields(line); len(f) == 2 && f[0] == "usage_usec" {
				us, err := strconv.ParseInt(f[1], 10, 64)
				return time.Duration(us) * time.Microsecond, err
			}
		}
	}
	return 0, fmt.Errorf("no cpu cgroup for sandbox %s (key %s)", id, key)
}

// childrenCPU is the CPU time of this process's waited-for children.
func childrenCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// runcFloorCPU is the mean host CPU of one `runc run /bin/true` on the
// template's overlay: runc and the container, which runc waits for.
func runcFloorCPU(ctx context.Context, cfg Config) (time.Duration, error) {
	layers, err := templateLayers(ctx, cfg.TemplateDir, cfg.Template)
	if err != nil {
		return 0, err
	}
	before := childrenCPU()
	d, err := runcFloor(ctx, layers, cfg.Creates)
	if err != nil {
		return 0, err
	}
	return (childrenCPU() - before) / time.Duration(len(d)), nil
}

// serverCPUPerCreate is the mean host CPU of create → first command →
// kill: the server's own and its children's CPU over the run, plus what
// each sandbox's cgroup used until its kill.
func serverCPUPerCreate(ctx context.Context, c *wire.Client, cfg Config, pid int) (time.Duration, error) {
	before, err := procCPU(pid)
	if err != nil {
		return 0, fmt.Errorf("server CPU (pass --server-pid): %w", err)
	}
	var inSandboxes time.Duration
	for range cfg.Creates {
		sb, err := c.Create(ctx, wire.CreateRequest{TemplateID: cfg.Template, Timeout: 600, Metadata: coldMeta("cpu")})
		if err != nil {
			return 0, err
		}
		r, err := c.Run(ctx, sb, "", "echo ok")
		if err == nil && r.Stdout != "ok\n" {
			err = fmt.Errorf("echo ok printed %q", r.Stdout)
		}
		if err == nil {
			var d time.Duration
			d, err = sandboxCPU(cfg.DataDir, sb.SandboxID)
			inSandboxes += d
		}
		if kerr := c.Kill(ctx, sb.SandboxID); err == nil {
			err = kerr
		}
		if err != nil {
			return 0, err
		}
	}
	after, err := procCPU(pid)
	if err != nil {
		return 0, err
	}
	return (after - before + inSandboxes) / time.Duration(cfg.Creates), nil
}

// burstResult is what a burst of simultaneous creates gave.
type burstResult struct {
	durs  []time.Duration // per successful create
	total time.Duration   // first request to last answer
	ids   []string
	errs  []error
}

// burst sends n creates at once and waits for every answer.
func burst(ctx context.Context, c *wire.Client, cfg Config, n int, md map[string]string) burstResult {
	var (
		mu  sync.Mutex
		res burstResult
		wg  sync.WaitGroup
	)
	start := time.Now()
	for range n {
		wg.Go(func() {
			t0 := time.Now()
			sb, err := c.Create(ctx, wire.CreateRequest{TemplateID: cfg.Template, Timeout: 600, Metadata: md})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				res.errs = append(res.errs, err)
				return
			}
			res.durs = append(res.durs, time.Since(t0))
			res.ids = append(res.ids, sb.SandboxID)
		})
	}
	wg.Wait()
	res.total = time.Since(start)
	return res
}

// killAll kills ids at once.
func killAll(ctx context.Context, c *wire.Client, ids []string) {
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Go(func() { _ = c.Kill(ctx, id) })
	}
	wg.Wait()
}

// hostVeths are the names the host end of sandbox id's veth pair may have:
// internal/network cuts it from its server's key of the id (the secret in
// /run/<instance>/netns.addr), or, for a port of an earlier version, from
// the id alone.
func hostVeths(id string) []string {
	h := sha256.Sum256([]byte(id))
	out := []string{"ab" + hex.EncodeToString(h[:])[:12]}
	secrets, _ := filepath.Glob("/run/*/netns.addr/.key-secret")
	for _, f := range secrets {
		if k, err := hostkey.Read(f); err == nil {
			out = append(out, "ab"+k.Key(id)[:12])
		}
	}
	return out
}

// leaks lists what is left on the host of the killed sandboxes ids: an
// API record, a bundle directory, a cgroup, a veth. It waits up to 30 s
// for teardown to finish.
func leaks(ctx context.Context, c *wire.Client, dataDir string, ids []string) []string {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var out []string
		for _, id := range ids {
			if _, err := c.Get(ctx, id); err == nil {
				out = append(out, id+": still listed")
			} else if we := (*wire.Error)(nil); !errors.As(err, &we) || we.Status != http.StatusNotFound {
				out = append(out, id+": "+err.Error())
			}
			for _, name := range hostVeths(id) {
				if _, err := net.InterfaceByName(name); err == nil {
					out = append(out, id+": veth "+name)
				}
			}
			if dataDir == "" {
				continue
			}
			key, err := bundle.HostKey(filepath.Join(dataDir, "sandboxes"), id)
			if err != nil {
				out = append(out, id+": "+err.Error())
				continue
			}
			if _, err := os.Stat(filepath.Join(dataDir, "sandboxes", key)); err == nil {
				out = append(out, id+": bundle directory")
			}
			if m, _ := filepath.Glob("/sys/fs/cgroup/*/*/" + key); len(m) > 0 {
				out = append(out, id+": cgroup "+m[0])
			}
		}
		if len(out) == 0 || time.Now().After(deadline) {
			return out
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// poolStats is one entry of GET /pools.
type poolStats struct {
	Template   string `json:"template"`
	TemplateID string `json:"templateID"`
	Ready      int    `json:"ready"`
	Filling    int    `json:"filling"`
	Min        int    `json:"min"`
	Target     int    `json:"target"`
	Hits       uint64 `json:"hits"`
	Misses     uint64 `json:"misses"`
}

// pool returns the server's warm pool of cfg.Template, if it has one.
func pool(ctx context.Context, cfg Config) (*poolStats, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(cfg.APIURL, "/")+"/pools", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("X-API-Key", cfg.APIKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /pools: %s", resp.Status)
	}
	var ps []poolStats
	if err := json.NewDecoder(resp.Body).Decode(&ps); err != nil {
		return nil, fmt.Errorf("GET /pools: %w", err)
	}
	for _, p := range ps {
		if p.Template == cfg.Template || p.TemplateID == cfg.Template {
			if cfg.MetricsURL != "" {
				// GET /pools shows a team the configuration and its own
				// claims only; the operator's metrics have the rest.
				if err := poolFromMetrics(ctx, cfg, &p); err != nil {
					return nil, err
				}
			}
			return &p, nil
		}
	}
	return nil, nil
}

// poolFromMetrics fills p's ready count, target and hits from the server's
// /metrics (cfg.MetricsURL).
func poolFromMetrics(ctx context.Context, cfg Config, p *poolStats) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, cfg.MetricsURL, nil)
	if err != nil {
		return err
	}
	if cfg.MetricsToken != "" {
		req.Header.Set("Authorization", "Bearer "+cfg.MetricsToken)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", cfg.MetricsURL, resp.Status)
	}
	return parsePoolMetrics(resp.Body, p)
}

// parsePoolMetrics reads agentbox_pool_ready, agentbox_pool_target and the
// hits of agentbox_pool_claims_total of p's template out of the Prometheus
// text format.
func parsePoolMetrics(r io.Reader, p *poolStats) error {
	label := `template="` + p.Template + `"`
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		name, rest, ok := strings.Cut(line, "{")
		if !ok || !strings.HasPrefix(name, "agentbox_pool_") {
			continue
		}
		labels, val, ok := strings.Cut(rest, "} ")
		if !ok || !slices.Contains(strings.Split(labels, ","), label) {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			return fmt.Errorf("metrics line %q: %w", line, err)
		}
		switch {
		case name == "agentbox_pool_ready":
			p.Ready = int(v)
		case name == "agentbox_pool_target":
			p.Target = int(v)
		case name == "agentbox_pool_claims_total" && strings.Contains(labels, `result="hit"`):
			p.Hits = uint64(v)
		}
	}
	return sc.Err()
}

// waitPool waits until the pool holds its target, ready and not filling.
func waitPool(ctx context.Context, cfg Config, timeout time.Duration) (*poolStats, error) {
	deadline := time.Now().Add(timeout)
	for {
		p, err := pool(ctx, cfg)
		if err != nil || p == nil {
			return p, err
		}
		if p.Ready >= p.Target && p.Filling == 0 {
			return p, nil
		}
		if time.Now().After(deadline) {
			return p, fmt.Errorf("pool at %d ready of %d after %s", p.Ready, p.Target, timeout)
		}
		select {
		case <-ctx.Done():
			return p, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// burstRows reports a burst: latency, failures and leaks.
func burstRows(ctx context.Context, c *wire.Client, cfg Config, what string, res burstResult, latencyFloor time.Duration) []row {
	n := len(res.durs) + len(res.errs)
	metric := fmt.Sprintf("%s: %d creates at once (p50/p99; %d failed)", what, n, len(res.errs))
	if len(res.errs) > 0 {
		metric += ": " + firstLine(res.errs[0].Error())
	}
	var rows []row
	if len(res.durs) == 0 {
		rows = append(rows, row{metric, "all failed", "", ""})
	} else {
		p99 := pct(res.durs, 99)
		rows = append(rows, row{metric, pair(pct(res.durs, 50), p99), latencyFloor.Round(time.Millisecond).String(), ratio(p99, latencyFloor)})
	}
	killAll(ctx, c, res.ids)
	left := leaks(ctx, c, cfg.DataDir, res.ids)
	value := "none"
	if len(left) > 0 {
		value = fmt.Sprintf("%d: %s", len(left), left[0])
	}
	return append(rows, row{"  " + what + ": left on the host after kill", value, "none", ""})
}

// measureCreateLoad is the rows of host CPU per create and of bursts.
func measureCreateLoad(ctx context.Context, c *wire.Client, cfg Config, runcP50 time.Duration, log *slog.Logger) []row {
	var rows []row
	add := func(r row) { rows = append(rows, r); log.Info("measured", "metric", r.metric, "value", r.value) }
	pid := cfg.ServerPID
	if pid == 0 {
		pid = listenerPID(cfg.APIURL)
	}
	cores := runtime.NumCPU()

	// Host CPU per create.
	floorCPU, err := runcFloorCPU(ctx, cfg)
	if err != nil {
		add(row{"floor: host CPU of runc run /bin/true", "error: " + err.Error(), "", ""})
	} else {
		add(row{"floor: host CPU of runc run /bin/true on overlay (mean)", round(floorCPU).String(), "", ""})
	}
	if cpu, err := serverCPUPerCreate(ctx, c, cfg, pid); err != nil {
		add(row{"host CPU per create", "error: " + err.Error(), "", ""})
	} else {
		add(row{"host CPU per create → first command → kill (server + children + sandbox cgroup, mean; target ≤ 1.5x)",
			round(cpu).String(), round(floorCPU).String(), ratio(cpu, floorCPU)})
	}

	// A burst of cold creates: latency, and the wall time against the
	// CPU the same number of runc runs needs on this host's cores.
	res := burst(ctx, c, cfg, cfg.Burst, coldMeta("burst"))
	cpuFloor := time.Duration(cfg.Burst) * floorCPU / time.Duration(cores)
	add(row{fmt.Sprintf("burst of %d cold creates: wall time (floor: %d × runc CPU ÷ %d cores; target ≤ 1.5x)", cfg.Burst, cfg.Burst, cores),
		round(res.total).String(), round(cpuFloor).String(), ratio(res.total, cpuFloor)})
	for _, r := range burstRows(ctx, c, cfg, "cold burst", res, runcP50) {
		add(r)
	}

	pb, err := pooledBurst(ctx, c, cfg)
	if err != nil {
		add(row{"warm pool", "error: " + err.Error(), "", ""})
		return rows
	}
	add(row{fmt.Sprintf("warm pool: adaptive size after a burst of %d (ready/target, refilled in)", cfg.Burst),
		fmt.Sprintf("%d/%d in %s", pb.ready, pb.target, round(pb.refill)), "", ""})
	if pb.hitsKnown {
		add(row{"  pooled burst: warm claims (a claim that fails starts cold and is counted too)", fmt.Sprintf("%d for %d creates", pb.hits, cfg.Burst), "", ""})
	}
	for _, r := range burstRows(ctx, c, cfg, "pooled burst (target p99 < 1 s)", pb.res, runcP50) {
		add(r)
	}

	// Single claims through the SDKs' create call, the pool refilled
	// before each.
	httpFloor, err := loopbackFloor(ctx, cfg.Commands)
	if err != nil {
		add(row{"floor: loopback HTTP round trip", "error: " + err.Error(), "", ""})
		return rows
	}
	claims, claimErrs := warmClaims(ctx, c, cfg)
	if len(claims) > 0 {
		p50 := pct(claims, 50)
		add(row{fmt.Sprintf("single warm claim, POST /sandboxes (p50/p95, %d errors; target p50 < 10 ms)", claimErrs),
			pair(p50, pct(claims, 95)), round(pct(httpFloor, 50)).String() + " HTTP", ratio(p50, pct(httpFloor, 50))})
	}
	return rows
}

// pooledResult is a burst through the warm pool once it sized itself.
type pooledResult struct {
	res           burstResult // the measured burst; its sandboxes still run
	ready, target int         // the pool after the first burst and its refill
	refill        time.Duration
	hits          uint64 // warm claims of the measured burst
	hitsKnown     bool
}

// pooledBurst sends a first burst of cfg.Burst creates, which teaches the
// server's warm pool of cfg.Template its size (cold starts for what it
// lacks), kills them, waits for the refill and sends the burst it measures.
func pooledBurst(ctx context.Context, c *wire.Client, cfg Config) (pooledResult, error) {
	var out pooledResult
	p, err := pool(ctx, cfg)
	switch {
	case err != nil:
		return out, err
	case p == nil:
		return out, fmt.Errorf("no warm pool for %s (start the server with --pool %s=1 --pool-max %d)", cfg.Template, cfg.Template, cfg.Burst+1)
	}
	first := burst(ctx, c, cfg, cfg.Burst, map[string]string{"bench": "pool-warmup"})
	killAll(ctx, c, first.ids)
	start := time.Now()
	p, err = waitPool(ctx, cfg, 5*time.Minute)
	if err != nil {
		return out, fmt.Errorf("warm pool refill after a burst: %w", err)
	}
	out.ready, out.target, out.refill = p.Ready, p.Target, time.Since(start)
	hits := p.Hits
	out.res = burst(ctx, c, cfg, cfg.Burst, map[string]string{"bench": "pool-burst"})
	if p, err := pool(ctx, cfg); err == nil && p != nil {
		out.hits, out.hitsKnown = p.Hits-hits, true
	}
	return out, nil
}

// warmClaims times cfg.Creates single creates through the SDKs' create
// call, each claiming from a refilled pool.
func warmClaims(ctx context.Context, c *wire.Client, cfg Config) (claims []time.Duration, errs int) {
	for range cfg.Creates {
		if _, err := waitPool(ctx, cfg, time.Minute); err != nil {
			errs++
			continue
		}
		t0 := time.Now()
		sb, err := c.Create(ctx, wire.CreateRequest{TemplateID: cfg.Template, Timeout: 600, Metadata: map[string]string{"bench": "claim"}})
		if err != nil {
			errs++
			continue
		}
		claims = append(claims, time.Since(t0))
		_ = c.Kill(ctx, sb.SandboxID)
	}
	return claims, errs
}
