// Command bench measures a running agentbox server against the raw floor of
// this host and prints one table. Usage:
//
//	go run ./bench --api-url http://127.0.0.1:3000 --api-key "$(cat /var/lib/agentbox/apikey)"
//
// The runc floor needs root and --template-dir (the server's template store).
// `--scenario all` (what `make bench` runs) measures every target of issue
// 14 in one table; without --api-url it starts a server of its own (make
// build's binaries) and removes it afterwards.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/agentbox/agentbox/bench/benchmark"
)

func main() {
	var cfg benchmark.Config
	flag.StringVar(&cfg.APIURL, "api-url", os.Getenv("E2B_API_URL"), "server base URL (default $E2B_API_URL)")
	flag.StringVar(&cfg.APIKey, "api-key", os.Getenv("E2B_API_KEY"), "API key (default $E2B_API_KEY)")
	flag.StringVar(&cfg.Template, "template", "base", "template to start sandboxes from")
	dataDir := flag.String("data-dir", "/var/lib/agentbox", "isolation: the server's data dir (its host key secret names the sandboxes' cgroups)")
	flag.StringVar(&cfg.TemplateDir, "template-dir", "/var/cache/agentbox/templates", "the server's template dir, for the runc floor (empty: skip)")
	flag.IntVar(&cfg.Creates, "creates", 10, "sequential create → first command samples (also runc floor samples)")
	flag.IntVar(&cfg.Commands, "commands", 50, "command round-trip samples")
	flag.IntVar(&cfg.Concurrent, "concurrent", 50, "simultaneous creates")
	flag.IntVar(&cfg.Burst, "burst", 100, "creates sent at once by the burst rows (cold, then through the server's warm pool if it has one)")
	flag.IntVar(&cfg.SizeMB, "size-mb", 100, "upload/download size in MB")
	flag.StringVar(&cfg.MetricsURL, "metrics-url", "", "the server's /metrics (its --metrics-listen address, or the API's /metrics with --metrics-token): adds the create step breakdown and the warm pool rows' sizes (GET /pools does not show a team the pool's size)")
	flag.StringVar(&cfg.MetricsToken, "metrics-token", os.Getenv("AGENTBOX_METRICS_TOKEN"), "the server's --metrics-token, for --metrics-url on the API address")
	flag.IntVar(&cfg.ServerPID, "server-pid", 0, "server pid for RSS (default: the process listening on the API port)")
	runs := flag.Int("runs", 100, "interpreter: warm runCode samples per language")
	tiers := flag.String("tiers", "container,gvisor", "isolation: comma-separated isolation tiers to measure (container, gvisor, microvm)")
	idle := flag.Int("idle", 10, "isolation: idle sandboxes per tier (the memory figure; the neighbour latency needs 4)")
	echoes := flag.Int("echoes", 30, "isolation: neighbour echo samples per phase")
	scenario := flag.String("scenario", "server", "all: every target of issue 14 in one table (target, figure, value, floor measured in the same run, ratio, target, met or missed), then how long each section took; without --api-url it starts its own server (--agentbox, --envd, --own-*) with a warm pool and the gVisor tier, and stops and removes it after; server: the server against the raw floor; isolation: start latency, memory per idle sandbox and neighbour latency per isolation tier; interpreter: runCode latency, first context after create and idle kernel memory (--template defaults to code-interpreter-v1, --creates to 5); commands: command round trip per tier (--tiers, --commands samples) against its floor, sampled alternately; lifecycle: pause/resume per --lifecycle-sizes against raw criu dump/restore, first command after resume with lazy restore off and on against raw criu restore (full and --lazy-pages) and the time until all memory is loaded, fork x10 against one restore; density: --density idle sandboxes of one tier at once, each answering a command, memory per sandbox, then all killed and the host checked for leftovers; largefile: --largefile-mb up and down through the official e2b JS SDK (streamed) against writing and reading the same bytes on the host's disk, with the server's peak RSS growth (--server-pid, default the API port's listener) and envd's peak RSS held to a bound; fulldisk: the full-disk section alone (its own server on a 512 MiB data disk it fills: what is refused and with what status, a running sandbox's round trip while full against before, its counter and file, the list of sandboxes before, while full and after, the time until a create works again once space is freed, and a paused sandbox resumed with its memory; then nothing of that server left on the host); gvisor: gVisor create → first command against runsc run /bin/true on the template's layers (--creates samples each), with the create step breakdown (--metrics-url)")
	density := flag.Int("density", 1000, "density: idle sandboxes of the first --tiers tier to hold at once")
	parallel := flag.Int("parallel", 8, "density: creates, commands and kills in flight")
	instance := flag.String("instance", "agentbox", "density: the server's --instance (its host state is checked after the kills)")
	bridge := flag.String("bridge", "agentbox0", "density: the server's --bridge")
	sizes := flag.String("lifecycle-sizes", "10,100,1024", "lifecycle: resident MB of the paused process, comma-separated")
	minFree := flag.Int("min-free-mib", 3072, "density: stop creating when the host's MemAvailable falls below this (MiB)")
	bin := flag.String("agentbox", "bin/agentbox", "all, without --api-url: the agentbox binary of the server it starts")
	envd := flag.String("envd", "bin/envd", "all, without --api-url: the envd binary of the server it starts")
	ownInstance := flag.String("own-instance", "agentbox-bench", "all, without --api-url: the --instance of the server it starts")
	ownBridge := flag.String("own-bridge", "abbench0", "all, without --api-url: the --bridge of the server it starts")
	ownSubnet := flag.String("own-subnet", "10.240.0.0/20", "all, without --api-url: the --subnet of the server it starts (free on the host; room for the density rows)")
	diskInstance := flag.String("fulldisk-instance", "agentbox-bdisk", "all, fulldisk: the --instance of the full-disk section's own server (its data dir is a 512 MiB tmpfs it fills)")
	diskBridge := flag.String("fulldisk-bridge", "abbdisk0", "all, fulldisk: the --bridge of the full-disk section's own server")
	diskSubnet := flag.String("fulldisk-subnet", "10.240.16.0/24", "all, fulldisk: the --subnet of the full-disk section's own server (free on the host, apart from --own-subnet)")
	ownDir := flag.String("own-dir", "", "all, without --api-url: where the server it starts keeps its data dir and log, removed afterwards (default: a new temporary directory)")
	soakOps := flag.Int("all-soak-ops", 2000, "all: operations of the soak section (create, command, file write, pause, resume, snapshot, fork, kill in cycles, with the server's warm pool), which prints the server's RSS, goroutines, open files, database size and its mounts, netns, veths, loop devices and cgroups at intervals; negative skips it")
	allDensity := flag.String("all-density", "1000,300", "all: container-tier and gVisor idle sandboxes the density rows hold at once (issue 14: 1000,300); 0 skips a tier")
	largeMB := flag.Int("largefile-mb", 5120, "largefile, all: MiB streamed up and down through the e2b JS SDK")
	jsDir := flag.String("js-dir", "e2e/js", "largefile, all: the e2b JS SDK's package dir (its node_modules)")
	flag.Parse()
	disk := benchmark.ServerConfig{Bin: *bin, Envd: *envd, TemplateDir: cfg.TemplateDir, Instance: *diskInstance, Bridge: *diskBridge, Subnet: *diskSubnet}
	if *scenario == "fulldisk" {
		os.Exit(runFullDisk(cfg, disk))
	}
	if *scenario == "all" {
		os.Exit(runAll(cfg, allFlags{disk: disk, soakOps: *soakOps, dataDir: *dataDir, instance: *instance, bridge: *bridge, sizes: *sizes, density: *allDensity, parallel: *parallel, minFree: *minFree, largeMB: *largeMB, jsDir: *jsDir,
			own: benchmark.ServerConfig{Bin: *bin, Envd: *envd, TemplateDir: cfg.TemplateDir, Instance: *ownInstance, Bridge: *ownBridge, Subnet: *ownSubnet, Dir: *ownDir}}))
	}
	if cfg.APIURL == "" || cfg.APIKey == "" {
		fmt.Fprintln(os.Stderr, "bench: --api-url and --api-key (or E2B_API_URL, E2B_API_KEY) are required")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if *scenario == "largefile" {
		rows := benchmark.LargeFileRows(ctx, benchmark.LargeFileConfig{APIURL: cfg.APIURL, APIKey: cfg.APIKey, Template: cfg.Template,
			SizeMB: *largeMB, JSDir: *jsDir, ServerPID: cfg.ServerPID, FloorDir: *dataDir})
		if err := benchmark.WriteTargets(os.Stdout, rows); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if *scenario == "interpreter" {
		icfg := benchmark.InterpreterConfig{APIURL: cfg.APIURL, APIKey: cfg.APIKey, DataDir: *dataDir, Runs: *runs}
		// Flags left at their defaults mean the scenario's own defaults.
		flag.Visit(func(f *flag.Flag) {
			switch f.Name {
			case "template":
				icfg.Template = cfg.Template
			case "creates":
				icfg.Creates = cfg.Creates
			}
		})
		if err := benchmark.RunInterpreter(ctx, icfg, os.Stdout, log); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if *scenario == "commands" {
		ccfg := benchmark.CommandsConfig{APIURL: cfg.APIURL, APIKey: cfg.APIKey, Template: cfg.Template, TemplateDir: cfg.TemplateDir, Tiers: strings.Split(*tiers, ","), Samples: cfg.Commands}
		if err := benchmark.RunCommands(ctx, ccfg, os.Stdout, log); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if *scenario == "lifecycle" {
		lcfg := benchmark.LifecycleConfig{APIURL: cfg.APIURL, APIKey: cfg.APIKey, Template: cfg.Template, ImageDir: *dataDir}
		for f := range strings.SplitSeq(*sizes, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n <= 0 {
				fmt.Fprintf(os.Stderr, "bench: --lifecycle-sizes: %q is not a size in MB\n", f)
				os.Exit(2)
			}
			lcfg.SizesMB = append(lcfg.SizesMB, n)
		}
		if err := benchmark.RunLifecycle(ctx, lcfg, os.Stdout, log); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if *scenario == "gvisor" {
		gcfg := benchmark.GVisorConfig{APIURL: cfg.APIURL, APIKey: cfg.APIKey, Template: cfg.Template, TemplateDir: cfg.TemplateDir, Creates: cfg.Creates,
			MetricsURL: cfg.MetricsURL, MetricsToken: cfg.MetricsToken}
		if err := benchmark.RunGVisor(ctx, gcfg, os.Stdout, log); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if *scenario == "density" {
		dcfg := benchmark.DensityConfig{APIURL: cfg.APIURL, APIKey: cfg.APIKey, Template: cfg.Template, Tier: strings.Split(*tiers, ",")[0], N: *density, Parallel: *parallel,
			DataDir: *dataDir, Instance: *instance, Bridge: *bridge, ServerPID: cfg.ServerPID, MinFreeMiB: *minFree}
		if err := benchmark.RunDensity(ctx, dcfg, os.Stdout, log); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if *scenario == "isolation" {
		icfg := benchmark.IsolationConfig{APIURL: cfg.APIURL, APIKey: cfg.APIKey, Template: cfg.Template, TemplateDir: cfg.TemplateDir, DataDir: *dataDir, Creates: cfg.Creates,
			Tiers: strings.Split(*tiers, ","), Idle: *idle, Echoes: *echoes}
		if err := benchmark.RunIsolation(ctx, icfg, os.Stdout, log); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	cfg.DataDir = *dataDir
	if err := benchmark.Run(ctx, cfg, os.Stdout, log); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}
