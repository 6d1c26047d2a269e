package benchmark

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/agentbox/agentbox/e2e/wire"
)

// LifecycleConfig configures RunLifecycle.
type LifecycleConfig struct {
	APIURL, APIKey string
	Template       string
	SizesMB        []int  // resident memory of the paused process; default 10, 100, 1024
	Cycles         int    // pause/resume cycles per size; default 3
	Forks          int    // copies in the fork row; default 10
	CRIU           string // CRIU binary of the raw floor; default /usr/local/libexec/agentbox/criu
	ImageDir       string // where the raw floor's images go: the server's data dir, so both write to the same disk
}

// memHog holds mb MiB of random bytes resident and says so in a file.
const memHog = `import os,sys,time; b=os.urandom(%d<<20); open(sys.argv[1],'w').write('1'); time.sleep(1e6)`

// RunLifecycle measures pause and resume of a sandbox whose process holds
// 10 MB, 100 MB and 1 GB, against raw `criu dump` and `criu restore` of the
// same process (python3 holding the same memory) on this host in the same
// run, the time to the first command after a resume, and fork ×N against
// one restore of the same sandbox.
func RunLifecycle(ctx context.Context, cfg LifecycleConfig, w io.Writer, log *slog.Logger) error {
	if cfg.Template == "" {
		cfg.Template = "base"
	}
	if len(cfg.SizesMB) == 0 {
		cfg.SizesMB = []int{10, 100, 1024}
	}
	if cfg.Cycles <= 0 {
		cfg.Cycles = 3
	}
	if cfg.Forks <= 0 {
		cfg.Forks = 10
	}
	if cfg.CRIU == "" {
		cfg.CRIU = "/usr/local/libexec/agentbox/criu"
	}
	c := wire.New(cfg.APIURL, cfg.APIKey)
	if err := c.Health(ctx); err != nil {
		return fmt.Errorf("server at %s: %w", cfg.APIURL, err)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "METRIC\tAGENTBOX\tFLOOR\tRATIO")
	for _, mb := range cfg.SizesMB {
		log.Info("lifecycle bench", "size MB", mb)
		dump, restore, ferr := criuFloor(ctx, cfg, mb)
		if ferr != nil {
			log.Warn("raw criu floor", "err", ferr)
		}
		pause, resume, first, inCRIU, inRestore, written, err := pauseResume(ctx, c, cfg, mb)
		if err != nil {
			fmt.Fprintf(tw, "pause/resume %d MB resident\terror: %s\t\t\n", mb, firstLine(err.Error()))
			continue
		}
		floorOf := func(d []time.Duration) (string, string) {
			if ferr != nil {
				return "", "raw criu: " + firstLine(ferr.Error())
			}
			return pair(pct(d, 50), pct(d, 95)), ""
		}
		fl, note := floorOf(dump)
		fmt.Fprintf(tw, "pause %d MB resident (p50/p95 of %d; target ≤1.3x raw criu dump)\t%s\t%s%s\t%s\n", mb, len(pause), pair(pct(pause, 50), pct(pause, 95)), fl, note, ratioIf(ferr, pct(pause, 50), pct(dump, 50)))
		if len(inCRIU) > 0 {
			fmt.Fprintf(tw, "pause %d MB: CRIU's own dump of the sandbox's tree inside it (p50/p95, from its dump.log)\t%s\t\t%s of the pause\n", mb, pair(pct(inCRIU, 50), pct(inCRIU, 95)), fmt.Sprintf("%.0f%%", 100*pct(inCRIU, 50).Seconds()/pct(pause, 50).Seconds()))
		}
		fl, note = floorOf(restore)
		fmt.Fprintf(tw, "resume %d MB resident (p50/p95; target ≤1.3x raw criu restore)\t%s\t%s%s\t%s\n", mb, pair(pct(resume, 50), pct(resume, 95)), fl, note, ratioIf(ferr, pct(resume, 50), pct(restore, 50)))
		if len(inRestore) > 0 {
			fmt.Fprintf(tw, "resume %d MB: CRIU's own restore of the sandbox's tree inside it (p50/p95, from its restore.log)\t%s\t\t%s of the resume\n", mb, pair(pct(inRestore, 50), pct(inRestore, 95)), fmt.Sprintf("%.0f%%", 100*pct(inRestore, 50).Seconds()/pct(resume, 50).Seconds()))
		}
		// The same tree's floor: CRIU's own work on exactly the sandbox's
		// processes, namespaces and mounts, against the whole call.
		if len(inCRIU) > 0 {
			fmt.Fprintf(tw, "pause %d MB against CRIU's dump of the same tree (target ≤1.3x)\t%s\t%s\t%s\n", mb, round(pct(pause, 50)), round(pct(inCRIU, 50)), ratio(pct(pause, 50), pct(inCRIU, 50)))
		}
		if len(inRestore) > 0 {
			fmt.Fprintf(tw, "resume %d MB against CRIU's restore of the same tree (target ≤1.3x)\t%s\t%s\t%s\n", mb, round(pct(resume, 50)), round(pct(inRestore, 50)), ratio(pct(resume, 50), pct(inRestore, 50)))
		}
		fmt.Fprintf(tw, "resume %d MB → first command answered (p50/p95)\t%s\t\t\n", mb, pair(pct(first, 50), pct(first, 95)))
		tracking, why := dirtyTracking(ctx, cfg.CRIU)
		incrementalRows(tw, mb, written, pause, tracking, why)
		lazyRows(ctx, tw, c, cfg, mb, restore, ferr)
	}

	// Fork ×N of a running sandbox against one restore of it.
	restore, forkDur, ok, err := forkVsRestore(ctx, c, cfg)
	if err != nil {
		fmt.Fprintf(tw, "fork ×%d\terror: %s\t\t\n", cfg.Forks, firstLine(err.Error()))
	} else {
		fmt.Fprintf(tw, "fork ×%d of a running sandbox, call until all run (%d answered a command; target ≤2x one restore)\t%s\t%s one restore\t%s\n", cfg.Forks, ok, round(forkDur), round(restore), ratio(forkDur, restore))
	}
	fmt.Fprintln(tw, "floors: criu dump/restore -d of python3 holding the same memory on this host, images on the server's data-dir disk; the sandbox's tree also holds envd (init and server) and runc's container state\t\t\t")
	return tw.Flush()
}

func ratioIf(err error, v, floor time.Duration) string {
	if err != nil {
		return ""
	}
	return ratio(v, floor)
}

// apiJSON sends one API call and decodes a 2xx answer into out.
func apiJSON(ctx context.Context, cfg LifecycleConfig, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, cfg.APIURL+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("X-API-Key", cfg.APIKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, strings.TrimSpace(string(data)))
	}
	if out != nil && len(data) > 0 {
		return json.Unmarshal(data, out)
	}
	return nil
}

// pauseResume creates a sandbox whose python3 holds mb MiB, then pauses and
// resumes it cfg.Cycles times; first is resume start → a command answered.
func pauseResume(ctx context.Context, c *wire.Client, cfg LifecycleConfig, mb int) (pause, resume, first, inCRIU, inRestore []time.Duration, written []int64, err error) {
	var sb wire.Sandbox
	if err := apiJSON(ctx, cfg, http.MethodPost, "/v2/sandboxes", map[string]any{"templateID": cfg.Template, "timeout": 1200, "memoryMB": max(512, 2*mb), "metadata": map[string]string{"bench": "lifecycle"}}, &sb); err != nil {
		return nil, nil, nil, nil, nil, nil, err
	}
	defer func() { _ = c.Kill(context.WithoutCancel(ctx), sb.SandboxID) }()
	hog := fmt.Sprintf(memHog, mb)
	if _, err := c.Run(ctx, &sb, "", fmt.Sprintf("nohup python3 -c %q /tmp/ready >/dev/null 2>&1 &", hog)); err != nil {
		return nil, nil, nil, nil, nil, nil, err
	}
	if err := waitReady(ctx, c, &sb); err != nil {
		return nil, nil, nil, nil, nil, nil, err
	}
	for range cfg.Cycles {
		t := time.Now()
		if err := apiJSON(ctx, cfg, http.MethodPost, "/sandboxes/"+sb.SandboxID+"/pause", nil, nil); err != nil {
			return nil, nil, nil, nil, nil, nil, err
		}
		pause = append(pause, time.Since(t))
		if img := newestFile(cfg.ImageDir, "checkpoint"); img != "" {
			if n, err := imageBytes(img); err == nil {
				written = append(written, n)
			}
		}
		if d, ok := lastCRIULog(cfg.ImageDir, filepath.Join("criu-work", "dump.log")); ok {
			inCRIU = append(inCRIU, d)
		}
		t = time.Now()
		if err := apiJSON(ctx, cfg, http.MethodPost, "/v2/sandboxes/"+sb.SandboxID+"/connect", map[string]any{"timeout": 1200}, nil); err != nil {
			return nil, nil, nil, nil, nil, nil, err
		}
		resume = append(resume, time.Since(t))
		if d, ok := lastCRIULog(cfg.ImageDir, "criu-restore.log"); ok {
			inRestore = append(inRestore, d)
		}
		if r, err := c.Run(ctx, &sb, "", "cat /tmp/ready"); err != nil || r.Stdout != "1" {
			return nil, nil, nil, nil, nil, nil, fmt.Errorf("first command after resume: %v (stdout %q)", err, r.Stdout)
		}
		first = append(first, time.Since(t))
	}
	return pause, resume, first, inCRIU, inRestore, written, nil
}

func waitReady(ctx context.Context, c *wire.Client, sb *wire.Sandbox) error {
	for range 600 {
		r, err := c.Run(ctx, sb, "", "cat /tmp/ready 2>/dev/null || true")
		if err != nil {
			return err
		}
		if r.Stdout == "1" {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return errors.New("the memory holder never became ready")
}

// criuFloor dumps and restores a python3 holding mb MiB with CRIU directly,
// cfg.Cycles times; each dump ends the process and each restore brings it
// back detached.
func criuFloor(ctx context.Context, cfg LifecycleConfig, mb int) (dump, restore []time.Duration, err error) {
	dir, err := os.MkdirTemp(cfg.ImageDir, "bench-criu-")
	if err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(dir)
	pid, err := startMemHog(ctx, dir, mb)
	defer func() {
		if pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}()
	if err != nil {
		return nil, nil, err
	}
	for i := range cfg.Cycles {
		img := filepath.Join(dir, "img"+strconv.Itoa(i))
		if err := os.Mkdir(img, 0o700); err != nil {
			return nil, nil, err
		}
		t := time.Now()
		if out, err := exec.CommandContext(ctx, cfg.CRIU, "dump", "-t", strconv.Itoa(pid), "-D", img, "-o", "dump.log").CombinedOutput(); err != nil {
			return nil, nil, fmt.Errorf("criu dump: %w: %s (log %s)", err, out, tail(filepath.Join(img, "dump.log")))
		}
		dump = append(dump, time.Since(t))
		waitGone(pid)
		pidFile := filepath.Join(dir, "pid"+strconv.Itoa(i))
		t = time.Now()
		if out, err := exec.CommandContext(ctx, cfg.CRIU, "restore", "-d", "-D", img, "-o", "restore.log", "--pidfile", pidFile).CombinedOutput(); err != nil {
			pid = 0
			return nil, nil, fmt.Errorf("criu restore: %w: %s (log %s)", err, out, tail(filepath.Join(img, "restore.log")))
		}
		restore = append(restore, time.Since(t))
		b, err := os.ReadFile(pidFile)
		if err != nil {
			return nil, nil, err
		}
		if pid, err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil {
			return nil, nil, err
		}
		_ = os.RemoveAll(img) // the next dump writes afresh, as a pause does
	}
	return dump, restore, nil
}

// tail is the last line of a log file.
func tail(p string) string {
	b, _ := os.ReadFile(p)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

// forkVsRestore times one restore of a paused sandbox (p50 of three) and
// then fork ×cfg.Forks of it running, each copy answering a command.
func forkVsRestore(ctx context.Context, c *wire.Client, cfg LifecycleConfig) (restore, fork time.Duration, ok int, err error) {
	sb, err := c.Create(ctx, wire.CreateRequest{TemplateID: cfg.Template, Timeout: 1200, Metadata: map[string]string{"bench": "fork"}})
	if err != nil {
		return 0, 0, 0, err
	}
	defer func() { _ = c.Kill(context.WithoutCancel(ctx), sb.SandboxID) }()
	if _, err := c.Run(ctx, sb, "", "true"); err != nil {
		return 0, 0, 0, err
	}
	var rs []time.Duration
	for range 3 {
		if err := apiJSON(ctx, cfg, http.MethodPost, "/sandboxes/"+sb.SandboxID+"/pause", nil, nil); err != nil {
			return 0, 0, 0, err
		}
		t := time.Now()
		if err := apiJSON(ctx, cfg, http.MethodPost, "/v2/sandboxes/"+sb.SandboxID+"/connect", map[string]any{"timeout": 1200}, nil); err != nil {
			return 0, 0, 0, err
		}
		rs = append(rs, time.Since(t))
	}
	var out []struct {
		Sandbox *wire.Sandbox `json:"sandbox"`
		Error   *struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	t := time.Now()
	if err := apiJSON(ctx, cfg, http.MethodPost, "/sandboxes/"+sb.SandboxID+"/fork", map[string]any{"count": cfg.Forks, "timeout": 300}, &out); err != nil {
		return 0, 0, 0, err
	}
	fork = time.Since(t)
	var firstErr error
	for _, f := range out {
		if f.Sandbox == nil {
			if firstErr == nil && f.Error != nil {
				firstErr = errors.New(f.Error.Message)
			}
			continue
		}
		if r, err := c.Run(ctx, f.Sandbox, "", "true"); err == nil && r.ExitCode == 0 {
			ok++
		}
		_ = c.Kill(context.WithoutCancel(ctx), f.Sandbox.SandboxID)
	}
	if ok == 0 && firstErr != nil {
		return 0, 0, 0, fmt.Errorf("fork: %w", firstErr)
	}
	return pct(rs, 50), fork, ok, nil
}

// lastCRIULog reads how long CRIU took in the newest of the sandboxes' logs
// named name (under each bundle) in the server's data dir: its last line's
// elapsed-time stamp.
func lastCRIULog(dataDir, name string) (time.Duration, bool) {
	newest := newestFile(dataDir, name)
	if newest == "" {
		return 0, false
	}
	last := tail(newest) // "(00.171205) Dumping finished successfully"
	end := strings.IndexByte(last, ')')
	if !strings.HasPrefix(last, "(") || end < 0 {
		return 0, false
	}
	sec, err := strconv.ParseFloat(strings.TrimSpace(last[1:end]), 64)
	if err != nil {
		return 0, false
	}
	return time.Duration(sec * float64(time.Second)), true
}

// newestFile is the newest of the files name (relative to a bundle) of the
// sandboxes under dataDir; "" if none has one.
func newestFile(dataDir, name string) string {
	logs, _ := filepath.Glob(filepath.Join(dataDir, "sandboxes", "*", name))
	var newest string
	var at time.Time
	for _, l := range logs {
		if fi, err := os.Stat(l); err == nil && fi.ModTime().After(at) {
			newest, at = l, fi.ModTime()
		}
	}
	return newest
}

// startMemHog starts a python3 holding mb MiB in its own session, which
// says so in dir/ready, and waits for it; a pid > 0 is to be killed even
// with an error.
func startMemHog(ctx context.Context, dir string, mb int) (int, error) {
	ready := filepath.Join(dir, "ready")
	cmd := exec.CommandContext(ctx, "python3", "-c", fmt.Sprintf(memHog, mb), ready)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	go func() { _ = cmd.Wait() }()
	for i := 0; ; i++ {
		if _, err := os.Stat(ready); err == nil {
			return cmd.Process.Pid, nil
		}
		if i > 600 {
			return cmd.Process.Pid, errors.New("python3 never became ready")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitGone waits (up to 5s) until a dumped process is reaped (by us the
// first time, by init after): restore wants the same pid.
func waitGone(pid int) {
	for range 500 {
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err != nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}
