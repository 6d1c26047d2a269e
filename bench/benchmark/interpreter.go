package benchmark

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// InterpreterConfig says what the interpreter scenario measures.
type InterpreterConfig struct {
	APIURL   string
	APIKey   string
	Template string // default "code-interpreter-v1"
	Creates  int    // sandboxes for the first-context figures; default 5
	Runs     int    // warm runCode samples per language; default 100
	Extra    int    // extra Python contexts for the marginal memory figure; default 3
	DataDir  string // the server's --data-dir: its host key secret names sandbox cgroups
}

func (c *InterpreterConfig) defaults() {
	if c.Template == "" {
		c.Template = "code-interpreter-v1"
	}
	if c.Creates <= 0 {
		c.Creates = 5
	}
	if c.Runs <= 0 {
		c.Runs = 100
	}
	if c.Extra <= 0 {
		c.Extra = 3
	}
}

// RunInterpreter measures the code interpreter through the gateway, as an
// agent's SDK sees it: runCode('1+1') on a warm default context (Python
// and JavaScript), the first result after create, and the memory an idle
// Python kernel holds. It reports, never asserts; the goals are in
// the GOAL column.
func RunInterpreter(ctx context.Context, cfg InterpreterConfig, w io.Writer, log *slog.Logger) error {
	cfg.defaults()
	c := agentbox.New(agentbox.WithAPIURL(cfg.APIURL), agentbox.WithAPIKey(cfg.APIKey))
	var rows []row
	add := func(r row) { rows = append(rows, r); log.Info("measured", "metric", r.metric, "value", r.value) }
	create := func(tag string) (*agentbox.Sandbox, error) {
		return c.Create(ctx, agentbox.CreateOptions{Template: cfg.Template, Timeout: 20 * time.Minute, Metadata: map[string]string{"bench": tag}})
	}

	// First context ready: create, then runCode until the default
	// context answers (the template's ready check only waits for the port).
	var created, firstPy, firstJS []time.Duration
	var errs int
	for range cfg.Creates {
		start := time.Now()
		sb, err := create("interpreter-first")
		if err != nil {
			errs++
			log.Warn("create", "err", err)
			continue
		}
		created = append(created, time.Since(start))
		if err := untilResult(ctx, sb, "python", "1+1", "2"); err != nil {
			errs++
			log.Warn("first python runCode", "err", err)
		} else {
			firstPy = append(firstPy, time.Since(start))
			if err := untilResult(ctx, sb, "js", "1+1", "2"); err != nil {
				errs++
				log.Warn("first js runCode", "err", err)
			} else {
				firstJS = append(firstJS, time.Since(start))
			}
		}
		_ = sb.Kill(ctx)
	}
	note := fmt.Sprintf("%d samples, %d errors", len(created), errs)
	add(row{"create (ready check: port 49999 open), p50/p95", pair(pct(created, 50), pct(created, 95)), "", note})
	add(row{"create → first runCode('1+1') Python result, p50/p95", pair(pct(firstPy, 50), pct(firstPy, 95)), "< 1.5s", note})
	add(row{"create → then first runCode('1+1') JS result, p50/p95", pair(pct(firstJS, 50), pct(firstJS, 95)), "", "after the Python one"})

	sb, err := create("interpreter-warm")
	if err != nil {
		add(row{"warm runCode / kernel memory", "error: " + firstLine(err.Error()), "", ""})
		return writeRows(w, rows)
	}
	defer func() { _ = sb.Kill(context.WithoutCancel(ctx)) }()

	// Warm round trips: the default context of each language, after a few
	// unmeasured calls.
	for _, lang := range []string{"python", "js"} {
		if err := untilResult(ctx, sb, lang, "1+1", "2"); err != nil {
			add(row{"runCode('1+1') warm, " + lang, "error: " + firstLine(err.Error()), "", ""})
			continue
		}
		for range 5 {
			_, _ = sb.RunCode(ctx, "1+1", agentbox.RunCodeOptions{Language: lang})
		}
		var ds []time.Duration
		var bad int
		for range cfg.Runs {
			s := time.Now()
			ex, err := sb.RunCode(ctx, "1+1", agentbox.RunCodeOptions{Language: lang})
			d := time.Since(s)
			if err != nil || ex.Text() != "2" {
				bad++
				continue
			}
			ds = append(ds, d)
		}
		goal := ""
		if lang == "python" {
			goal = "p50 < 10ms"
		}
		add(row{fmt.Sprintf("runCode('1+1') warm %s, p50/p95", lang), pair(pct(ds, 50), pct(ds, 95)), goal, fmt.Sprintf("%d samples, %d wrong or failed", len(ds), bad)})
	}

	// Memory: what the default Python kernel process holds (PSS shares
	// the libraries with other kernels fairly; RSS counts them whole), and
	// what each extra idle Python context adds to the sandbox's cgroup.
	if rss, pss, err := kernelMemory(ctx, sb, "[i]pykernel_launcher"); err != nil {
		add(row{"idle Python kernel RSS / PSS", "error: " + firstLine(err.Error()), "", ""})
	} else {
		add(row{"idle Python kernel RSS / PSS", fmt.Sprintf("%.1f MiB / %.1f MiB", rss, pss), "", "default context's ipykernel, after the warm runs"})
	}
	if rss, pss, err := kernelMemory(ctx, sb, "[n]ode_kernel"); err == nil {
		add(row{"idle JS kernel RSS / PSS", fmt.Sprintf("%.1f MiB / %.1f MiB", rss, pss), "", "default context's Node kernel"})
	}
	before, _ := cgroupRSS(cfg.DataDir, sb.ID)
	var extra int
	for range cfg.Extra {
		cc, err := sb.CreateCodeContext(ctx, agentbox.CodeContextOptions{Language: "python"})
		if err != nil {
			log.Warn("extra context", "err", err)
			continue
		}
		if ex, err := sb.RunCode(ctx, "1+1", agentbox.RunCodeOptions{ContextID: cc.ID}); err != nil || ex.Text() != "2" {
			log.Warn("extra context runCode", "err", err)
			continue
		}
		extra++
	}
	time.Sleep(2 * time.Second) // let the new kernels go idle
	after, _ := cgroupRSS(cfg.DataDir, sb.ID)
	switch {
	case before == 0 || after == 0:
		add(row{"sandbox memory per extra idle Python context", "-", "", "sandbox cgroup not readable here (run as root on the server's host, with its --data-dir)"})
	case extra == 0:
		add(row{"sandbox memory per extra idle Python context", "-", "", "no extra context started"})
	default:
		per := (float64(after) - float64(before)) / float64(extra) / (1 << 20)
		add(row{"sandbox memory per extra idle Python context", fmt.Sprintf("%.1f MiB", per), "", fmt.Sprintf("cgroup rss+mapped+shmem+kmem growth over %d contexts", extra)})
	}
	return writeRows(w, rows)
}

// untilResult runs code in lang's default context until its main result is
// want, for up to a minute: right after create the kernel may still be
// starting, which the interpreter answers with an error or a wait.
func untilResult(ctx context.Context, sb *agentbox.Sandbox, lang, code, want string) error {
	deadline := time.Now().Add(time.Minute)
	for {
		ex, err := sb.RunCode(ctx, code, agentbox.RunCodeOptions{Language: lang, Timeout: 30 * time.Second})
		if err == nil && ex.Text() == want {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("runCode(%q) gave %q (error %v)", code, ex.Text(), ex.Error)
		}
		if time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// kernelMemory sums RSS and PSS (MiB) of the sandbox processes whose
// command line matches the pattern match, from /proc/<pid>/smaps_rollup.
// Patterns like "[i]pykernel" keep the shell running pgrep from matching.
func kernelMemory(ctx context.Context, sb *agentbox.Sandbox, match string) (rss, pss float64, err error) {
	r, err := sb.Commands.Run(ctx, `for p in $(pgrep -f '`+match+`'); do grep -E '^(Rss|Pss):' /proc/$p/smaps_rollup; done`, agentbox.WithUser("root"))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(r.Stdout, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "Rss:":
			rss += kb / 1024
		case "Pss:":
			pss += kb / 1024
		}
	}
	if rss == 0 {
		return 0, 0, fmt.Errorf("no process matching %q", match)
	}
	return rss, pss, nil
}

// writeRows prints rows in the scenario tables' style.
func writeRows(w io.Writer, rows []row) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "METRIC\tAGENTBOX\tGOAL\tNOTE")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.metric, r.value, r.floor, r.ratio)
	}
	return tw.Flush()
}
