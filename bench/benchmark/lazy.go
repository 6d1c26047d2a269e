package benchmark

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/agentbox/agentbox/e2e/wire"
)

// lazyRows prints, for one size, resume → first command with lazy restore
// off and on (the sandbox's agentbox.lazyResume), the time until all of a
// lazy resume's memory is in, against raw `criu restore` of the same
// memory, full and lazy (criu lazy-pages + restore --lazy-pages).
func lazyRows(ctx context.Context, tw io.Writer, c *wire.Client, cfg LifecycleConfig, mb int, restoreFloor []time.Duration, floorErr error) {
	type run struct {
		first, all []time.Duration
		err        error
	}
	var runs [2]run
	for i, mode := range []string{"off", "on"} {
		runs[i].first, runs[i].all, runs[i].err = lazyResumes(ctx, c, cfg, mb, mode)
	}
	lazyRestore, lazyAll, lerr := criuLazyFloor(ctx, cfg, mb)
	floor, note := "", ""
	if floorErr != nil {
		note = "raw criu: " + firstLine(floorErr.Error())
	} else {
		floor = round(pct(restoreFloor, 50)).String() + " criu restore"
	}
	for i, mode := range []string{"off", "on"} {
		r := runs[i]
		if r.err != nil {
			fmt.Fprintf(tw, "resume %d MB, lazy %s → first command\terror: %s\t\t\n", mb, mode, firstLine(r.err.Error()))
			continue
		}
		fmt.Fprintf(tw, "resume %d MB, lazy %s → first command answered (p50/p95)\t%s\t%s%s\t%s\n", mb, mode, pair(pct(r.first, 50), pct(r.first, 95)), floor, note, ratioIf(floorErr, pct(r.first, 50), pct(restoreFloor, 50)))
	}
	if lerr != nil {
		fmt.Fprintf(tw, "raw criu lazy restore %d MB\terror: %s\t\t\n", mb, firstLine(lerr.Error()))
	} else {
		fmt.Fprintf(tw, "raw criu restore --lazy-pages %d MB: restore returns / all memory in (p50)\t%s / %s\t\t\n", mb, round(pct(lazyRestore, 50)), round(pct(lazyAll, 50)))
	}
	if r := runs[1]; r.err == nil && len(r.all) > 0 {
		fl, rt := "", ""
		if lerr == nil {
			fl, rt = round(pct(lazyAll, 50)).String()+" raw lazy", ratio(pct(r.all, 50), pct(lazyAll, 50))
		}
		fmt.Fprintf(tw, "resume %d MB, lazy on: call → all memory loaded (p50/p95)\t%s\t%s\t%s\n", mb, pair(pct(r.all, 50), pct(r.all, 95)), fl, rt)
	}
}

// lazyResumes pauses and resumes a sandbox holding mb MiB whose
// agentbox.lazyResume is mode, cfg.Cycles times: first is the resume call
// → a command answered, all the call → its page daemon gone (lazy only).
func lazyResumes(ctx context.Context, c *wire.Client, cfg LifecycleConfig, mb int, mode string) (first, all []time.Duration, err error) {
	var sb wire.Sandbox
	if err := apiJSON(ctx, cfg, http.MethodPost, "/v2/sandboxes", map[string]any{"templateID": cfg.Template, "timeout": 1200, "memoryMB": max(512, 2*mb),
		"metadata": map[string]string{"bench": "lifecycle", "agentbox.lazyResume": mode}}, &sb); err != nil {
		return nil, nil, err
	}
	defer func() { _ = c.Kill(context.WithoutCancel(ctx), sb.SandboxID) }()
	if _, err := c.Run(ctx, &sb, "", fmt.Sprintf("nohup python3 -c %q /tmp/ready >/dev/null 2>&1 &", fmt.Sprintf(memHog, mb))); err != nil {
		return nil, nil, err
	}
	if err := waitReady(ctx, c, &sb); err != nil {
		return nil, nil, err
	}
	for range cfg.Cycles {
		if err := apiJSON(ctx, cfg, http.MethodPost, "/sandboxes/"+sb.SandboxID+"/pause", nil, nil); err != nil {
			return nil, nil, err
		}
		t := time.Now()
		if err := apiJSON(ctx, cfg, http.MethodPost, "/v2/sandboxes/"+sb.SandboxID+"/connect", map[string]any{"timeout": 1200}, nil); err != nil {
			return nil, nil, err
		}
		// The bundle just restored has the newest CRIU restore log.
		dir := newestBundle(cfg.ImageDir, "criu-restore.log")
		done := make(chan time.Duration, 1)
		go func() {
			for dir != "" {
				if _, err := os.Stat(filepath.Join(dir, "lazy-pages.pid")); err != nil {
					break
				}
				time.Sleep(2 * time.Millisecond)
			}
			done <- time.Since(t)
		}()
		if r, err := c.Run(ctx, &sb, "", "cat /tmp/ready"); err != nil || r.Stdout != "1" {
			return nil, nil, fmt.Errorf("first command after resume: %v (stdout %q)", err, r.Stdout)
		}
		first = append(first, time.Since(t))
		d := <-done
		if mode == "on" {
			if lg, err := os.Stat(filepath.Join(dir, "criu-lazy-pages.log")); err != nil || lg.ModTime().Before(t) {
				return nil, nil, errors.New("the resume was not lazy (no page daemon ran; see the server log)")
			}
			all = append(all, d)
		}
	}
	return first, all, nil
}

// newestBundle is the bundle under dataDir whose file name (a plain file
// name) is newest.
func newestBundle(dataDir, name string) string {
	newest := newestFile(dataDir, name)
	if newest == "" {
		return ""
	}
	return filepath.Dir(newest)
}

// criuLazyFloor dumps a python3 holding mb MiB with CRIU and restores it
// lazily, cfg.Cycles times: restore is `criu restore --lazy-pages -d` until
// it returns, all until the lazy-pages daemon (started just before) has
// put every page in and exited.
func criuLazyFloor(ctx context.Context, cfg LifecycleConfig, mb int) (restore, all []time.Duration, err error) {
	dir, err := os.MkdirTemp(cfg.ImageDir, "bench-criu-lazy-")
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
		img, work := filepath.Join(dir, "img"+strconv.Itoa(i)), filepath.Join(dir, "work"+strconv.Itoa(i))
		for _, d := range []string{img, work} {
			if err := os.Mkdir(d, 0o700); err != nil {
				return nil, nil, err
			}
		}
		if out, err := exec.CommandContext(ctx, cfg.CRIU, "dump", "-t", strconv.Itoa(pid), "-D", img, "-o", "dump.log").CombinedOutput(); err != nil {
			return nil, nil, fmt.Errorf("criu dump: %w: %s (log %s)", err, out, tail(filepath.Join(img, "dump.log")))
		}
		waitGone(pid)
		t := time.Now()
		r, w, err := os.Pipe()
		if err != nil {
			return nil, nil, err
		}
		lp := exec.CommandContext(ctx, cfg.CRIU, "lazy-pages", "-D", img, "-W", work, "-o", "lazy.log", "--status-fd", "3")
		lp.ExtraFiles = []*os.File{w}
		err = lp.Start()
		w.Close()
		if err != nil {
			r.Close()
			return nil, nil, err
		}
		_, err = r.Read(make([]byte, 1))
		r.Close()
		if err != nil {
			_ = lp.Process.Kill()
			_ = lp.Wait()
			return nil, nil, fmt.Errorf("criu lazy-pages: not ready: %w", err)
		}
		pidFile := filepath.Join(dir, "pid"+strconv.Itoa(i))
		if out, err := exec.CommandContext(ctx, cfg.CRIU, "restore", "-d", "--lazy-pages", "-D", img, "-W", work, "-o", "restore.log", "--pidfile", pidFile).CombinedOutput(); err != nil {
			_ = lp.Process.Kill()
			_ = lp.Wait()
			pid = 0
			return nil, nil, fmt.Errorf("criu restore --lazy-pages: %w: %s (log %s)", err, out, tail(filepath.Join(work, "restore.log")))
		}
		restore = append(restore, time.Since(t))
		if err := lp.Wait(); err != nil {
			return nil, nil, fmt.Errorf("criu lazy-pages: %w (log %s)", err, tail(filepath.Join(work, "lazy.log")))
		}
		all = append(all, time.Since(t))
		b, err := os.ReadFile(pidFile)
		if err != nil {
			return nil, nil, err
		}
		if pid, err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil {
			return nil, nil, err
		}
		_ = os.RemoveAll(img)
		_ = os.RemoveAll(work)
	}
	return restore, all, nil
}
