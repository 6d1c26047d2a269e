package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/agentbox/agentbox/bench/benchmark"
)

// allFlags are the flags of the all scenario beyond the server's Config.
type allFlags struct {
	dataDir, instance, bridge string // an existing server's
	sizes, density            string
	parallel, minFree         int
	largeMB                   int
	jsDir                     string
	soakOps                   int
	own                       benchmark.ServerConfig // the server to start without --api-url
	disk                      benchmark.ServerConfig // the full-disk section's own server
}

// runAll runs the all scenario and returns the exit code.
func runAll(cfg benchmark.Config, f allFlags) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "bench: --scenario all needs root (the raw runc, runsc and CRIU floors, and the server it starts)")
		return 2
	}
	acfg := benchmark.AllConfig{APIURL: cfg.APIURL, APIKey: cfg.APIKey, Template: cfg.Template, TemplateDir: cfg.TemplateDir,
		DataDir: f.dataDir, Instance: f.instance, Bridge: f.bridge, ServerPID: cfg.ServerPID, MetricsURL: cfg.MetricsURL, MetricsToken: cfg.MetricsToken,
		Creates: cfg.Creates, Commands: cfg.Commands, Burst: cfg.Burst, SizeMB: cfg.SizeMB, Parallel: f.parallel, MinFreeMiB: f.minFree,
		LargeFileMB: f.largeMB, JSDir: f.jsDir, SoakOps: f.soakOps, FullDisk: f.disk}
	var err error
	if acfg.SizesMB, err = ints("--lifecycle-sizes", f.sizes, 1); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 2
	}
	d, err := ints("--all-density", f.density, 0)
	if err != nil || len(d) != 2 {
		fmt.Fprintf(os.Stderr, "bench: --all-density %q: want two counts, container,gvisor (e.g. 1000,300)\n", f.density)
		return 2
	}
	// 0 means the default in AllConfig; here it skips the tier.
	acfg.DensityContainer, acfg.DensityGVisor = orSkip(d[0]), orSkip(d[1])

	if acfg.APIURL == "" {
		own := f.own
		own.Pool, own.PoolMax = acfg.Template+"=1", max(acfg.Burst, 100)+1
		srv, err := benchmark.StartServer(ctx, own, log)
		if srv != nil {
			defer func() {
				if err := srv.Stop(context.WithoutCancel(ctx)); err != nil {
					fmt.Fprintln(os.Stderr, "bench: stopping the server it started:", err)
				} else {
					fmt.Println("server stopped; its netns, veths, cgroups, mounts, nftables tables and data dir removed")
				}
			}()
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench: start a server:", err)
			return 1
		}
		acfg.APIURL, acfg.APIKey, acfg.DataDir, acfg.MetricsURL, acfg.MetricsToken = srv.URL, srv.APIKey, srv.DataDir, srv.MetricsURL, ""
		acfg.Instance, acfg.Bridge, acfg.ServerPID = own.Instance, own.Bridge, srv.PID
	} else if acfg.APIKey == "" {
		fmt.Fprintln(os.Stderr, "bench: --api-key (or E2B_API_KEY) is required with --api-url")
		return 2
	}
	fmt.Println(benchmark.Machine(ctx, "/usr/local/libexec/agentbox/criu"))
	if _, err := benchmark.RunAll(ctx, acfg, os.Stdout, log); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	fmt.Println("load average after:", benchmark.LoadAvg())
	return 0
}

// runFullDisk runs the full-disk section alone and returns the exit code.
func runFullDisk(cfg benchmark.Config, disk benchmark.ServerConfig) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "bench: --scenario fulldisk needs root (the server it starts and the data disk it mounts)")
		return 2
	}
	acfg := benchmark.AllConfig{Template: cfg.Template, TemplateDir: cfg.TemplateDir, Commands: cfg.Commands, FullDisk: disk}
	if _, err := benchmark.RunFullDisk(ctx, acfg, os.Stdout, log); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	return 0
}

// ints parses a comma-separated list of integers of at least least.
func ints(flag, s string, least int) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < least {
			return nil, fmt.Errorf("%s: %q is not a count of at least %d", flag, f, least)
		}
		out = append(out, n)
	}
	return out, nil
}

func orSkip(n int) int {
	if n == 0 {
		return -1
	}
	return n
}
