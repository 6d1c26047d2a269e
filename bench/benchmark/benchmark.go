// Package benchmark measures a running agentbox server next to the raw floor
// of the same host (runc on an overlay of the same template, fork/exec, disk
// I/O) in one run, and prints the figures with their ratio to the floor. It
// never asserts timings: it reports them.
package benchmark

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/agentbox/agentbox/e2e/wire"
	"github.com/agentbox/agentbox/internal/template"
)

// Config says what to measure and against which server.
type Config struct {
	APIURL      string // server base URL (API and data plane)
	APIKey      string
	Template    string // template to start sandboxes from; default "base"
	TemplateDir string // the server's --template-dir, for the runc floor; empty skips it
	Creates     int    // sequential create→first-command samples; default 10
	Commands    int    // command round-trip samples; default 50
	Concurrent  int    // simultaneous creates; default 50
	SizeMB      int    // upload/download size; default 100
	ServerPID   int    // for RSS; 0 finds the process listening on the API port
	// MetricsURL is the server's /metrics (with MetricsToken, its
	// --metrics-token): when set, the create rows are followed by where the
	// milliseconds went, step by step.
	MetricsURL, MetricsToken string
	// DataDir is the server's --data-dir (sandbox cgroups and leak
	// checks); Burst how many creates the burst rows send at once.
	DataDir string
	Burst   int
}

func (c *Config) defaults() {
	if c.Template == "" {
		c.Template = "base"
	}
	if c.Creates <= 0 {
		c.Creates = 10
	}
	if c.Commands <= 0 {
		c.Commands = 50
	}
	if c.Concurrent <= 0 {
		c.Concurrent = 50
	}
	if c.SizeMB <= 0 {
		c.SizeMB = 100
	}
	if c.Burst <= 0 {
		c.Burst = 100
	}
}

// row is one line of the result table.
type row struct {
	metric, value, floor, ratio string
}

// Run measures and writes the table to w. A failed measurement is reported
// in its row; Run fails only when the server cannot be reached at all.
func Run(ctx context.Context, cfg Config, w io.Writer, log *slog.Logger) error {
	cfg.defaults()
	c := wire.New(cfg.APIURL, cfg.APIKey)
	if err := c.Health(ctx); err != nil {
		return fmt.Errorf("server at %s: %w", cfg.APIURL, err)
	}
	pid := cfg.ServerPID
	if pid == 0 {
		pid = listenerPID(cfg.APIURL)
	}
	rssBefore := rssKB(pid)
	var rows []row
	add := func(r row) { rows = append(rows, r); log.Info("measured", "metric", r.metric, "value", r.value) }

	// Floors first, so they are not disturbed by sandboxes the server runs.
	var runcP50, runcP95, execP50, execP95 time.Duration
	var shell []time.Duration // bash -l -c true in the template
	if cfg.TemplateDir != "" {
		if layers, err := templateLayers(ctx, cfg.TemplateDir, cfg.Template); err != nil {
			add(row{"floor: runc run /bin/true on overlay", "error: " + err.Error(), "", ""})
		} else {
			if d, err := runcFloor(ctx, layers, cfg.Creates); err != nil {
				add(row{"floor: runc run /bin/true on overlay", "error: " + err.Error(), "", ""})
			} else {
				runcP50, runcP95 = pct(d, 50), pct(d, 95)
				add(row{"floor: runc run /bin/true on overlay (p50/p95)", pair(runcP50, runcP95), "", ""})
			}
			if d, err := shellFloor(ctx, layers, cfg.Commands); err != nil {
				add(row{"floor: fork/exec bash -l -c true in the template", "error: " + err.Error(), "", ""})
			} else {
				shell = d
				add(row{"floor: fork/exec bash -l -c true in the template (p50/p95)", pair(pct(d, 50), pct(d, 95)), "", ""})
			}
		}
	}
	if shell == nil {
		// No template rootfs to chroot into: the host's /bin/true.
		if d, err := execFloor(ctx, cfg.Commands); err == nil {
			shell = d
			add(row{"floor: fork/exec /bin/true on host (p50/p95)", pair(pct(d, 50), pct(d, 95)), "", ""})
		}
	}
	if d, err := loopbackFloor(ctx, cfg.Commands); err != nil {
		add(row{"floor: loopback HTTP round trip", "error: " + err.Error(), "", ""})
	} else if shell != nil {
		// A command's floor: the shell it runs plus one HTTP exchange.
		execP50, execP95 = pct(shell, 50)+pct(d, 50), pct(shell, 95)+pct(d, 95)
		add(row{"floor: loopback HTTP round trip (p50/p95)", pair(pct(d, 50), pct(d, 95)), "", ""})
	}

	// Create → first command.
	var stepsBefore stepTotals
	if cfg.MetricsURL != "" {
		var err error
		if stepsBefore, err = scrapeSteps(ctx, cfg.MetricsURL, cfg.MetricsToken); err != nil {
			log.Warn("metrics", "err", err)
		}
	}
	var createDur []time.Duration
	var createErrs int
	for range cfg.Creates {
		d, err := createFirstCommand(ctx, c, cfg.Template, coldMeta("create"))
		if err != nil {
			createErrs++
			log.Warn("create", "err", err)
			continue
		}
		createDur = append(createDur, d)
	}
	if len(createDur) > 0 {
		p50, p95 := pct(createDur, 50), pct(createDur, 95)
		add(row{fmt.Sprintf("create → first command (p50/p95, %d errors)", createErrs), pair(p50, p95), pair(runcP50, runcP95), ratio(p50, runcP50)})
	} else {
		add(row{"create → first command", fmt.Sprintf("all %d failed", createErrs), "", ""})
	}
	if stepsBefore != nil {
		if after, err := scrapeSteps(ctx, cfg.MetricsURL, cfg.MetricsToken); err != nil {
			log.Warn("metrics", "err", err)
		} else {
			rows = append(rows, stepRows(stepsBefore, after)...)
		}
	}

	// Command round trip, upload, download on one sandbox.
	sb, err := c.Create(ctx, wire.CreateRequest{TemplateID: cfg.Template, Timeout: 1200, Metadata: map[string]string{"bench": "io"}})
	if err != nil {
		add(row{"command round trip / transfers", "error: " + err.Error(), "", ""})
	} else {
		rows = append(rows, measureIO(ctx, c, sb, cfg, execP50, execP95, log)...)
		_ = c.Kill(ctx, sb.SandboxID)
	}

	// Concurrent creates.
	rows = append(rows, measureConcurrent(ctx, c, cfg, runcP50))
	rows = append(rows, measureCreateLoad(ctx, c, cfg, runcP50, log)...)

	rssAfter := rssKB(pid)
	if pid > 0 {
		add(row{fmt.Sprintf("server RSS (pid %d) before → after", pid), fmt.Sprintf("%.1f MiB → %.1f MiB", float64(rssBefore)/1024, float64(rssAfter)/1024), "", ""})
	} else {
		add(row{"server RSS", "server process not found (pass --server-pid)", "", ""})
	}

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "METRIC\tAGENTBOX\tFLOOR\tRATIO")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.metric, r.value, r.floor, r.ratio)
	}
	return tw.Flush()
}

func measureIO(ctx context.Context, c *wire.Client, sb *wire.Sandbox, cfg Config, execP50, execP95 time.Duration, log *slog.Logger) []row {
	var rows []row
	var rtt []time.Duration
	var errs int
	for range cfg.Commands {
		start := time.Now()
		r, err := c.Run(ctx, sb, "", "true")
		if err != nil || r.ExitCode != 0 {
			errs++
			continue
		}
		rtt = append(rtt, time.Since(start))
	}
	if len(rtt) > 0 {
		p50, p95 := pct(rtt, 50), pct(rtt, 95)
		rows = append(rows, row{fmt.Sprintf("command round trip `true` (p50/p95, %d errors)", errs), pair(p50, p95), pair(execP50, execP95), ratio(p50, execP50)})
	}

	tr := transfers(ctx, c, sb, cfg.SizeMB)
	if tr.err != nil {
		return append(rows, row{"upload/download", "error: " + tr.err.Error(), "", ""})
	}
	diskW, diskErr := diskFloor(os.TempDir(), make([]byte, int64(cfg.SizeMB)<<20))
	if diskErr != nil {
		log.Warn("disk floor", "err", diskErr)
	}
	mb := float64(cfg.SizeMB)
	up := tr.up
	if tr.upErr != nil {
		rows = append(rows, row{fmt.Sprintf("upload %d MB", cfg.SizeMB), "error: " + tr.upErr.Error(), "", ""})
	} else {
		rows = append(rows, row{fmt.Sprintf("upload %d MB (octet-stream)", cfg.SizeMB), rate(mb, up), rate(mb, diskW) + " disk write", ratioRate(mb, up, diskW)})
	}
	// Downloads are held to the upload rate (the target is >= 0.8x), in
	// both codings a client may ask for: the SDKs' fetch asks for gzip.
	for i, coding := range downloadCodings() {
		name := fmt.Sprintf("download %d MB, %s (vs upload)", cfg.SizeMB, coding)
		down, err := tr.down[i], tr.downErr[i]
		switch {
		case err != nil:
			rows = append(rows, row{name, "error: " + err.Error(), "", ""})
		default:
			rows = append(rows, row{name, rate(mb, down), rate(mb, up) + " upload", fmt.Sprintf("%.2fx", up.Seconds()/down.Seconds())})
		}
	}
	return rows
}

// downloadCodings are the codings a download is measured in: the SDKs'
// fetch asks for gzip.
func downloadCodings() [2]string { return [2]string{"identity", "gzip"} }

// transferResult is one upload of random bytes and its downloads in each
// coding, checked byte for byte.
type transferResult struct {
	up      time.Duration
	upErr   error
	down    [2]time.Duration // per downloadCodings
	downErr [2]error
	err     error // no data to send
}

// transfers uploads sizeMB of random bytes to sb and downloads them in each
// of downloadCodings.
func transfers(ctx context.Context, c *wire.Client, sb *wire.Sandbox, sizeMB int) transferResult {
	var out transferResult
	size := int64(sizeMB) << 20
	data := make([]byte, size)
	if _, err := rand.Read(data); err != nil {
		out.err = err
		return out
	}
	want := sha256.Sum256(data)
	start := time.Now()
	out.upErr = c.Upload(ctx, sb, "/tmp/bench.bin", bytes.NewReader(data), size)
	out.up = time.Since(start)
	for i, coding := range downloadCodings() {
		h := sha256.New()
		start = time.Now()
		n, err := c.DownloadEncoded(ctx, sb, "/tmp/bench.bin", h, coding)
		out.down[i] = time.Since(start)
		if err == nil && (n != size || !bytes.Equal(h.Sum(nil), want[:])) {
			err = fmt.Errorf("corrupt: %d bytes, checksum mismatch", n)
		}
		if err == nil && out.upErr != nil {
			err = fmt.Errorf("nothing uploaded: %w", out.upErr)
		}
		out.downErr[i] = err
	}
	return out
}

func measureConcurrent(ctx context.Context, c *wire.Client, cfg Config, runcP50 time.Duration) row {
	var (
		mu   sync.Mutex
		durs []time.Duration
		ids  []string
		errs []error
		wg   sync.WaitGroup
	)
	start := time.Now()
	for range cfg.Concurrent {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			sb, err := c.Create(ctx, wire.CreateRequest{TemplateID: cfg.Template, Timeout: 600, Metadata: coldMeta("concurrent")})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			durs = append(durs, time.Since(t0))
			ids = append(ids, sb.SandboxID)
		}()
	}
	wg.Wait()
	total := time.Since(start)
	var kw sync.WaitGroup
	for _, id := range ids {
		kw.Add(1)
		go func() { defer kw.Done(); _ = c.Kill(ctx, id) }()
	}
	kw.Wait()
	metric := fmt.Sprintf("%d concurrent creates (total; p50/p95; %d errors)", cfg.Concurrent, len(errs))
	if len(errs) > 0 {
		metric += ": " + firstLine(errs[0].Error())
	}
	if len(durs) == 0 {
		return row{metric, "all failed", "", ""}
	}
	p50, p95 := pct(durs, 50), pct(durs, 95)
	return row{metric, fmt.Sprintf("%s; %s", round(total), pair(p50, p95)), runcP50.Round(time.Millisecond).String(), ratio(p50, runcP50)}
}

func templateLayers(ctx context.Context, dir, ref string) ([]string, error) {
	st, err := template.NewStore(dir, slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, err
	}
	t, err := st.Get(ctx, "", ref)
	if err != nil {
		return nil, err
	}
	return t.Layers, nil
}

var pidPattern = regexp.MustCompile(`pid=(\d+)`)

// listenerPID finds the process listening on the URL's port with ss(8);
// 0 when it cannot tell (remote server, no ss).
func listenerPID(apiURL string) int {
	u, err := url.Parse(apiURL)
	if err != nil || u.Port() == "" {
		return 0
	}
	out, err := exec.Command("ss", "-Hltnp", "sport = :"+u.Port()).Output()
	if err != nil {
		return 0
	}
	m := pidPattern.FindStringSubmatch(string(out))
	if m == nil {
		return 0
	}
	pid, _ := strconv.Atoi(m[1])
	return pid
}

// rssKB is VmRSS of pid in KiB, 0 when unknown.
func rssKB(pid int) int64 {
	if pid <= 0 {
		return 0
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb
		}
	}
	return 0
}

// pct is the p-th percentile (nearest rank) of ds.
func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (p*len(s)+99)/100 - 1
	return s[max(0, min(i, len(s)-1))]
}

func round(d time.Duration) time.Duration {
	if d > 10*time.Millisecond {
		return d.Round(time.Millisecond)
	}
	return d.Round(10 * time.Microsecond)
}

func pair(a, b time.Duration) string {
	if a == 0 && b == 0 {
		return ""
	}
	return fmt.Sprintf("%s / %s", round(a), round(b))
}

func ratio(v, floor time.Duration) string {
	if floor <= 0 {
		return ""
	}
	return fmt.Sprintf("%.1fx", float64(v)/float64(floor))
}

func rate(mb float64, d time.Duration) string {
	if d <= 0 {
		return ""
	}
	return fmt.Sprintf("%.0f MB/s", mb/d.Seconds())
}

// ratioRate is the server's transfer time over the floor's (like the other
// ratios: above 1 is slower than the floor).
func ratioRate(mb float64, d, floor time.Duration) string {
	if d <= 0 || floor <= 0 {
		return ""
	}
	return fmt.Sprintf("%.1fx", d.Seconds()/floor.Seconds())
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > 120 {
		s = s[:120] + "…"
	}
	return s
}
