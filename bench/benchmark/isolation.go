package benchmark

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/e2e/wire"
	"github.com/agentbox/agentbox/internal/hostkey"
	"github.com/agentbox/agentbox/internal/runtime/bundle"
	"github.com/agentbox/agentbox/internal/runtime/microvm"
)

// IsolationConfig says what the isolation scenario measures.
type IsolationConfig struct {
	APIURL      string
	APIKey      string
	Template    string   // default "base"
	TemplateDir string   // for the raw runc/runsc floor; empty skips it
	DataDir     string   // the server's --data-dir: its host key secret names sandbox cgroups
	Tiers       []string // default container, gvisor
	Creates     int      // sequential creates per tier; default 10
	Idle        int      // idle sandboxes per tier for the memory figure; default 10
	Echoes      int      // neighbour echo samples per phase; default 30
	HostMemGiB  float64  // memory to extrapolate "how many fit" to; default this host's
}

func (c *IsolationConfig) defaults() {
	if c.Template == "" {
		c.Template = "base"
	}
	if len(c.Tiers) == 0 {
		c.Tiers = []string{"container", "gvisor"}
	}
	if c.Creates <= 0 {
		c.Creates = 10
	}
	if c.Idle <= 0 {
		c.Idle = 10
	}
	if c.Echoes <= 0 {
		c.Echoes = 30
	}
	if c.HostMemGiB <= 0 {
		c.HostMemGiB = float64(memInfo("MemTotal")) / (1 << 30)
	}
}

// memInfo returns a /proc/meminfo field in bytes.
func memInfo(field string) uint64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// RunIsolation measures, per isolation tier: create → first command
// latency next to raw `runc run` / `runsc run` of /bin/true; host memory
// per idle sandbox and how many idle sandboxes fit; and a neighbour's
// `echo` round trip (p50, p99, worst) idle, under a CPU spin, a fork bomb
// and a memory thrash in other sandboxes, and under all three at once; and
// how soon the abuser's own owner runs a command again after killing a fork
// bomb in it. It reports, never asserts (e2e/outside/neighbour_test.go and
// reserve_test.go assert).
func RunIsolation(ctx context.Context, cfg IsolationConfig, w io.Writer, log *slog.Logger) error {
	cfg.defaults()
	c := wire.New(cfg.APIURL, cfg.APIKey)
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TIER\tMETRIC\tVALUE\tNOTE")
	var layers []string
	if cfg.TemplateDir != "" {
		var err error
		if layers, err = templateLayers(ctx, cfg.TemplateDir, cfg.Template); err != nil {
			log.Warn("no raw floor", "err", err)
		}
	}
	for _, tier := range cfg.Tiers {
		log.Info("isolation bench", "tier", tier)
		create := func() (*wire.Sandbox, error) {
			return c.Create(ctx, wire.CreateRequest{TemplateID: cfg.Template, Timeout: 1800, Metadata: map[string]string{"agentbox.isolation": tier, "bench": "isolation"}})
		}
		// Start latency.
		var lat []time.Duration
		for range cfg.Creates {
			start := time.Now()
			sb, err := create()
			if err != nil {
				return fmt.Errorf("%s: create: %w", tier, err)
			}
			if _, err := c.Run(ctx, sb, "", "true"); err != nil {
				return fmt.Errorf("%s: first command: %w", tier, err)
			}
			lat = append(lat, time.Since(start))
			_ = c.Kill(ctx, sb.SandboxID)
		}
		fmt.Fprintf(tw, "%s\tcreate → first command p50/p95\t%s\t%d samples\n", tier, pair(pct(lat, 50), pct(lat, 95)), len(lat))
		if tier == "microvm" {
			microVMFloor(ctx, tw, cfg.Creates)
		} else if len(layers) > 0 {
			runtime := map[string]string{"container": "runc", "gvisor": "runsc"}[tier]
			if floor, err := rawFloor(ctx, runtime, layers, cfg.Creates); err != nil {
				fmt.Fprintf(tw, "%s\traw `%s run` /bin/true p50\t-\t%v\n", tier, runtime, firstLine(err.Error()))
			} else {
				fmt.Fprintf(tw, "%s\traw `%s run` /bin/true p50\t%s\toverlay mount + run + unmount, default spec\n", tier, runtime, round(pct(floor, 50)))
			}
		}

		// Memory per idle sandbox: MemAvailable before and after.
		dropCaches()
		before := memInfo("MemAvailable")
		var idle []*wire.Sandbox
		for range cfg.Idle {
			sb, err := create()
			if err != nil {
				return fmt.Errorf("%s: idle create: %w", tier, err)
			}
			idle = append(idle, sb)
		}
		time.Sleep(3 * time.Second) // let envd settle
		dropCaches()
		after := memInfo("MemAvailable")
		per := float64(0)
		if before > after {
			per = float64(before-after) / float64(cfg.Idle)
		}
		var cg uint64
		for _, sb := range idle {
			n, err := cgroupRSS(cfg.DataDir, sb.SandboxID)
			if err != nil {
				return fmt.Errorf("%s: cgroup memory: %w", tier, err)
			}
			cg += n
		}
		cgPer := float64(cg) / float64(len(idle))
		fmt.Fprintf(tw, "%s\tcgroup memory per idle sandbox\t%.1f MiB\trss + kernel memory charged to the sandbox's cgroup (v1), mean of %d\n", tier, cgPer/(1<<20), len(idle))
		fmt.Fprintf(tw, "%s\thost memory per idle sandbox\t%.1f MiB\tMemAvailable drop over %d idle sandboxes, page cache dropped (noisy on a shared host)\n", tier, per/(1<<20), cfg.Idle)
		per = max(per, cgPer)
		if per > 0 {
			fit := cfg.HostMemGiB * (1 << 30) * 0.9 / per
			fmt.Fprintf(tw, "%s\tidle sandboxes that fit in %.0f GiB\t%.0f\textrapolated, 10%% kept for the host\n", tier, cfg.HostMemGiB, fit)
		}

		// Neighbour latency under abuse: idle[0] is the neighbour,
		// idle[1..3] the abusers, one abuse each, then all at once.
		if len(idle) >= 2 {
			nb := idle[0]
			const perCall = 30 * time.Second
			base := EchoLatency(ctx, c, nb, cfg.Echoes, perCall)
			fmt.Fprintf(tw, "%s\tneighbour echo p50 / p99 / worst, idle\t%s\t%d samples\n", tier, base, base.Samples)
			// The abuse must outlast the samples: allow 2 s each.
			secs := 5 + 2*cfg.Echoes
			abuses := Abuses()
			for i, a := range abuses {
				bad := idle[1+i%(len(idle)-1)]
				done := runBackground(ctx, c, bad, a.Script(secs))
				time.Sleep(2 * time.Second)
				l := EchoLatency(ctx, c, nb, cfg.Echoes, perCall)
				fmt.Fprintf(tw, "%s\tneighbour echo p50 / p99 / worst, %s next door\t%s\t%s the idle p50\n", tier, a.Name, l, ratio(l.P50, base.P50))
				_, _ = c.Run(ctx, bad, "root", "pkill -9 -f 'while :|python3|timeout' ; true")
				<-done
			}
			if len(idle) > len(abuses) {
				var dones []<-chan struct{}
				for i, a := range abuses {
					dones = append(dones, runBackground(ctx, c, idle[1+i], a.Script(secs)))
				}
				time.Sleep(2 * time.Second)
				l := EchoLatency(ctx, c, nb, cfg.Echoes, perCall)
				fmt.Fprintf(tw, "%s\tneighbour echo p50 / p99 / worst, all three next door\t%s\t%s the idle p50\n", tier, l, ratio(l.P50, base.P50))
				for i := range abuses {
					_, _ = c.Run(ctx, idle[1+i], "root", "pkill -9 -f 'while :|python3|timeout' ; true")
				}
				for _, d := range dones {
					<-d
				}
			}
			// Next to the neighbour's worst echo, the abuser's own owner:
			// how soon its next command runs once it killed a fork bomb
			// that held the sandbox's process limit.
			value, note := "-", "from the owner's kill (through envd) of a fork bomb at the pids limit to its first successful `echo`"
			if d, err := RecoverFromForkBomb(ctx, c, idle[1], 60*time.Second, perCall); errors.Is(err, ErrNeverBlocked) {
				value, note = "0s", firstLine(err.Error())
			} else if err != nil {
				note = firstLine(err.Error())
			} else {
				value = round(d).String()
			}
			fmt.Fprintf(tw, "%s\towner recovery after killing a fork bomb\t%s\t%s\n", tier, value, note)
		}
		for _, sb := range idle {
			_ = c.Kill(ctx, sb.SandboxID)
		}
	}
	return tw.Flush()
}

// runBackground runs script as root in sb and closes the channel when it
// ends (or is killed).
func runBackground(ctx context.Context, c *wire.Client, sb *wire.Sandbox, script string) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = c.Run(ctx, sb, "root", script)
	}()
	return done
}

// cgroupRSS is the anonymous memory plus kernel memory charged to a
// sandbox's memory cgroup (cgroup v1), found under any instance's parent by
// the sandbox's host key (cgroups are not named by sandbox id).
func cgroupRSS(dataDir, id string) (uint64, error) {
	key, err := bundle.HostKey(filepath.Join(dataDir, "sandboxes"), id)
	if err != nil {
		return 0, fmt.Errorf("host key of %s (pass the server's --data-dir): %w", id, err)
	}
	m, _ := filepath.Glob("/sys/fs/cgroup/memory/*/" + key + "/memory.stat")
	if len(m) == 0 {
		// A microVM: its QEMU's cgroup (guest RAM as QEMU touched it, and QEMU).
		if k, err := hostkey.Read(filepath.Join(dataDir, "microvm", ".hostkey")); err == nil {
			m, _ = filepath.Glob("/sys/fs/cgroup/memory/*/microvm-" + k.Key(id) + "/memory.stat")
		}
	}
	if len(m) == 0 {
		return 0, fmt.Errorf("no memory cgroup for sandbox %s (key %s)", id, key)
	}
	b, err := os.ReadFile(m[0])
	if err != nil {
		return 0, err
	}
	var rss uint64
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && (f[0] == "total_rss" || f[0] == "total_mapped_file" || f[0] == "total_shmem") {
			v, _ := strconv.ParseUint(f[1], 10, 64)
			rss += v
		}
	}
	if k, err := os.ReadFile(filepath.Join(filepath.Dir(m[0]), "memory.kmem.usage_in_bytes")); err == nil {
		v, _ := strconv.ParseUint(strings.TrimSpace(string(k)), 10, 64)
		rss += v
	}
	return rss, nil
}

// dropCaches frees clean page cache so memory figures count what sandboxes
// hold, not what they read once. Best effort (needs root).
func dropCaches() {
	unix.Sync()
	_ = os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0o200)
}

// rawFloor times `<runtime> run` of /bin/true on an overlay of the
// template (runsc: systrap, no network), per run.
func rawFloor(ctx context.Context, runtime string, layers []string, n int) ([]time.Duration, error) {
	if runtime == "runc" {
		return runcFloor(ctx, layers, n)
	}
	bin, err := exec.LookPath(runtime)
	if err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp("", "agentbox-bench-runsc-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	bundle := filepath.Join(work, "bundle")
	if err := os.MkdirAll(bundle, 0o755); err != nil {
		return nil, err
	}
	if err := writeSpec(ctx, bundle); err != nil {
		return nil, err
	}
	lower := slices.Clone(layers)
	slices.Reverse(lower)
	var out []time.Duration
	for i := range n {
		upper, wk, rootfs := filepath.Join(work, "upper"), filepath.Join(work, "work"), filepath.Join(bundle, "rootfs")
		for _, d := range []string{upper, wk, rootfs} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return nil, err
			}
		}
		start := time.Now()
		if err := unix.Mount("overlay", rootfs, "overlay", 0, fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", strings.Join(lower, ":"), upper, wk)); err != nil {
			return nil, err
		}
		cmd := exec.CommandContext(ctx, bin, "--root", filepath.Join(work, "state"), "--platform=systrap", "--network=none",
			"run", "--bundle", bundle, fmt.Sprintf("bench-runsc-%d-%d", os.Getpid(), i))
		runOut, runErr := cmd.CombinedOutput()
		umErr := unix.Unmount(rootfs, unix.MNT_DETACH)
		elapsed := time.Since(start)
		if runErr != nil {
			return nil, fmt.Errorf("runsc run: %w: %s", runErr, runOut)
		}
		if umErr != nil {
			return nil, umErr
		}
		out = append(out, elapsed)
		_ = os.RemoveAll(upper)
		_ = os.RemoveAll(wk)
	}
	return out, nil
}

// microVMFloor prints the raw boot of the microVM guest (kernel to envd's
// init, no devices) under KVM and under TCG separately, saying which one
// booted: the server uses KVM where it boots, else TCG.
func microVMFloor(ctx context.Context, tw io.Writer, n int) {
	initrds, _ := filepath.Glob("/run/*/microvm/initrd-*.cpio")
	if len(initrds) == 0 {
		fmt.Fprintf(tw, "microvm\traw guest boot\t-\tno initrd under /run/*/microvm (the server builds it at first use)\n")
		return
	}
	slices.SortFunc(initrds, func(a, b string) int { return modTime(b).Compare(modTime(a)) })
	ran := ""
	for _, accel := range []string{"kvm", "tcg"} {
		var boots []time.Duration
		var err error
		for range max(n/2, 3) {
			bctx, cancel := context.WithTimeout(ctx, map[string]time.Duration{"kvm": 15 * time.Second, "tcg": time.Minute}[accel])
			var d time.Duration
			d, err = microvm.RawBoot(bctx, accel, initrds[0])
			cancel()
			if err != nil {
				break
			}
			boots = append(boots, d)
		}
		if err != nil {
			fmt.Fprintf(tw, "microvm\traw guest boot to init (%s)\t-\tdid not boot: %s\n", accel, firstLine(err.Error()))
			continue
		}
		if ran == "" {
			ran = accel
		}
		fmt.Fprintf(tw, "microvm\traw guest boot to init (%s) p50\t%s\tqemu microvm + kernel + initrd, %d samples\n", accel, round(pct(boots, 50)), len(boots))
	}
	if ran != "" {
		fmt.Fprintf(tw, "microvm\taccelerator the server runs\t%s\tthe first that boots: kvm, else tcg (unless serve --microvm-accel)\n", ran)
	}
}

func modTime(path string) time.Time {
	fi, err := os.Stat(path)
	if err != nil {
		return time.Time{}
	}
	return fi.ModTime()
}
