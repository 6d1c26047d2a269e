package benchmark

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/agentbox/agentbox/e2e/wire"
)

// AllConfig configures RunAll: one server, every target of issue 14.
type AllConfig struct {
	APIURL, APIKey string
	Template       string // default "base"
	TemplateDir    string // the server's template store (the raw floors run on its layers)
	DataDir        string // the server's --data-dir (cgroups, CRIU logs, leak checks)
	Instance       string // the server's --instance (density's leak check)
	Bridge         string // the server's --bridge
	ServerPID      int    // 0: the process listening on the API port
	// MetricsURL (with MetricsToken) is the server's /metrics: the warm
	// pool's size and the create step breakdown.
	MetricsURL, MetricsToken string

	Creates  int   // cold create and floor samples per tier; default 10
	Commands int   // command round trips per tier; default 50
	Burst    int   // creates sent at once; default 100
	SizeMB   int   // upload/download size; default 100
	SizesMB  []int // pause/resume sizes; default 10, 100, 1024
	Cycles   int   // pause/resume cycles per size; default 3
	Forks    int   // copies of the fork row; default 10
	// LargeFileMB goes up and down through the e2b JS SDK in JSDir
	// (e2e/js); default 5120.
	LargeFileMB int
	JSDir       string
	// DensityContainer and DensityGVisor idle sandboxes are held at once;
	// defaults 1000 and 300 (issue 14), negative skips a tier.
	DensityContainer, DensityGVisor int
	Parallel                        int     // density: creates, commands and kills in flight; default 8
	MinFreeMiB                      int     // density: stop creating below this much MemAvailable
	BudgetGiB                       float64 // density: memory the counts must fit in; default 24
	SoakOps                         int     // soak operations; default 2000, negative skips (all_soak.go)
	// FullDisk is the full-disk section's own server (all_fulldisk.go):
	// binaries, instance, bridge and subnet distinct from the main one's.
	FullDisk ServerConfig
}

func (c *AllConfig) defaults() {
	if c.Template == "" {
		c.Template = "base"
	}
	if c.Creates <= 0 {
		c.Creates = 10
	}
	if c.Commands <= 0 {
		c.Commands = 50
	}
	if c.Burst <= 0 {
		c.Burst = 100
	}
	if c.SizeMB <= 0 {
		c.SizeMB = 100
	}
	if len(c.SizesMB) == 0 {
		c.SizesMB = []int{10, 100, 1024}
	}
	if c.Cycles <= 0 {
		c.Cycles = 3
	}
	if c.Forks <= 0 {
		c.Forks = 10
	}
	if c.DensityContainer == 0 {
		c.DensityContainer = 1000
	}
	if c.DensityGVisor == 0 {
		c.DensityGVisor = 300
	}
	if c.Parallel <= 0 {
		c.Parallel = 8
	}
	if c.BudgetGiB <= 0 {
		c.BudgetGiB = 24
	}
}

// server is the Config of the server scenario's helpers.
func (c *AllConfig) server() Config {
	return Config{APIURL: c.APIURL, APIKey: c.APIKey, Template: c.Template, TemplateDir: c.TemplateDir, Creates: c.Creates,
		Commands: c.Commands, SizeMB: c.SizeMB, ServerPID: c.ServerPID, MetricsURL: c.MetricsURL, MetricsToken: c.MetricsToken,
		DataDir: c.DataDir, Burst: c.Burst}
}

// lifecycle is the LifecycleConfig of the lifecycle scenario's helpers.
func (c *AllConfig) lifecycle() LifecycleConfig {
	return LifecycleConfig{APIURL: c.APIURL, APIKey: c.APIKey, Template: c.Template, SizesMB: c.SizesMB, Cycles: c.Cycles,
		Forks: c.Forks, CRIU: "/usr/local/libexec/agentbox/criu", ImageDir: c.DataDir}
}

// allRun is one run of every section: the figures later sections are held
// to, and the notes printed under the table.
type allRun struct {
	cfg    AllConfig
	c      *wire.Client
	log    *slog.Logger
	layers []string      // the template's rootfs layers
	runc   time.Duration // p50 of `runc run /bin/true`, the cold floor
	notes  []string
}

func (a *allRun) note(format string, args ...any) {
	a.notes = append(a.notes, fmt.Sprintf(format, args...))
}

// section is one part of the table.
type section struct {
	name string
	run  func(context.Context, *allRun) []TargetRow
}

// sections are issue 14's targets in order.
func sections() []section {
	return []section{
		{"cold create (1)", coldRows},
		{"host CPU and burst (2)", cpuRows},
		{"warm pool (3)", poolRows},
		{"command round trip (4)", commandRows},
		{"transfers (5)", transferRows},
		{"pause/resume (6)", lifecycleRows},
		{"fork (7)", forkRows},
		{"density (8)", densityRows},
		{"large files (9)", largeFileRows},
		{"soak", soakRows},
		{"full disk", fullDiskRows},
	}
}

// RunAll measures every target of issue 14 against the server, each next
// to its raw floor measured in the same run, and prints one table, then
// the notes (breakdowns, what ran out) and how long each section took. A
// part that fails puts its error in its row; RunAll fails only when the
// server cannot be reached. It returns the rows it printed.
func RunAll(ctx context.Context, cfg AllConfig, w io.Writer, log *slog.Logger) ([]TargetRow, error) {
	cfg.defaults()
	a := &allRun{cfg: cfg, c: wire.New(cfg.APIURL, cfg.APIKey), log: log}
	if err := a.c.Health(ctx); err != nil {
		return nil, fmt.Errorf("server at %s: %w", cfg.APIURL, err)
	}
	if a.cfg.ServerPID == 0 {
		a.cfg.ServerPID = listenerPID(cfg.APIURL)
	}
	var err error
	if a.layers, err = templateLayers(ctx, cfg.TemplateDir, cfg.Template); err != nil {
		a.note("template layers of %s in %s (the raw floors run on them): %v", cfg.Template, cfg.TemplateDir, err)
	}
	var rows []TargetRow
	var took []string
	for _, s := range sections() {
		if ctx.Err() != nil {
			break
		}
		log.Info("section", "name", s.name)
		start := time.Now()
		got := s.run(ctx, a)
		took = append(took, fmt.Sprintf("%s %s", s.name, time.Since(start).Round(time.Second)))
		for _, r := range got {
			log.Info("measured", "target", r.Target, "figure", r.Figure, "value", r.Value, "floor", r.Floor, "err", r.Err)
		}
		rows = append(rows, got...)
	}
	if err := WriteTargets(w, rows); err != nil {
		return rows, err
	}
	fmt.Fprintln(w)
	for _, n := range a.notes {
		fmt.Fprintln(w, n)
	}
	fmt.Fprintf(w, "sections took: %s\n", strings.Join(took, ", "))
	return rows, ctx.Err()
}
