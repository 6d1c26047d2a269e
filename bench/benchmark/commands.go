package benchmark

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/e2e/wire"
)

// CommandsConfig configures RunCommands.
type CommandsConfig struct {
	APIURL, APIKey string
	Template       string
	TemplateDir    string   // the server's template store, for the shell floor
	Tiers          []string // isolation tiers; default container
	Samples        int      // round trips per tier; default 100
}

// RunCommands measures the command round trip (`bash -l -c true`, what the
// SDK runs) per isolation tier against its floor: the same shell
// fork/exec'd chrooted in the template plus one loopback HTTP round trip.
// Floor and server samples alternate, so both see the same load on a
// shared host.
func RunCommands(ctx context.Context, cfg CommandsConfig, w io.Writer, log *slog.Logger) error {
	if cfg.Template == "" {
		cfg.Template = "base"
	}
	if len(cfg.Tiers) == 0 {
		cfg.Tiers = []string{"container"}
	}
	if cfg.Samples <= 0 {
		cfg.Samples = 100
	}
	layers, err := templateLayers(ctx, cfg.TemplateDir, cfg.Template)
	if err != nil {
		return fmt.Errorf("template layers (--template-dir): %w", err)
	}
	fl, closeFloor, err := newCommandFloor(ctx, layers)
	if err != nil {
		return err
	}
	defer closeFloor()

	c := wire.New(cfg.APIURL, cfg.APIKey)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "METRIC\tAGENTBOX\tFLOOR\tRATIO")
	for _, tier := range cfg.Tiers {
		sb, err := c.Create(ctx, wire.CreateRequest{TemplateID: cfg.Template, Timeout: 600, Metadata: map[string]string{"agentbox.isolation": tier, "bench": "commands"}})
		if err != nil {
			fmt.Fprintf(tw, "%s: command round trip\terror: %s\t\t\n", tier, firstLine(err.Error()))
			continue
		}
		sm, err := fl.sample(ctx, c, sb, cfg.Samples, true, log)
		if err != nil {
			_ = c.Kill(ctx, sb.SandboxID)
			return err
		}
		rtt, floor, hostSh, inside, health, errs := sm.rtt, sm.floor, sm.hostShell, sm.inside, sm.health, sm.errs
		_ = c.Kill(ctx, sb.SandboxID)
		if len(rtt) == 0 {
			fmt.Fprintf(tw, "%s: command round trip\tall %d failed\t\t\n", tier, errs)
			continue
		}
		p50, p95, f50, f95 := pct(rtt, 50), pct(rtt, 95), pct(floor, 50), pct(floor, 95)
		fmt.Fprintf(tw, "%s: command round trip `bash -l -c true` (p50/p95, %d samples, %d errors; target ≤1.5x)\t%s\t%s\t%s\n", tier, len(rtt), errs, pair(p50, p95), pair(f50, f95), ratio(p50, f50))
		if len(inside) > 0 && len(health) > 0 {
			i50, h50 := pct(inside, 50), pct(health, 50)
			fmt.Fprintf(tw, "%s:   `bash -l -c true` timed inside the sandbox by bash (p50/p95; the tier's own fork/exec cost)\t%s\t%s\t%s\n", tier, pair(i50, pct(inside, 95)), round(pct(hostSh, 50)), ratio(i50, pct(hostSh, 50)))
			fmt.Fprintf(tw, "%s:   envd round trip without a process (GET /health, p50/p95)\t%s\t\t\n", tier, pair(h50, pct(health, 95)))
			fmt.Fprintf(tw, "%s:   round trip against inside + /health (what envd and the API add)\t%s\t%s\t%s\n", tier, round(p50), round(i50+h50), ratio(p50, i50+h50))
		}
	}
	fmt.Fprintln(tw, "floor: bash -l -c true fork/exec'd chrooted in the template + one loopback HTTP round trip, sampled alternately with the server's\t\t\t")
	return tw.Flush()
}

// insideOnce times `bash -l -c true` inside the sandbox, as bash's own
// time builtin measures it (fork, exec and the login profile).
func insideOnce(ctx context.Context, c *wire.Client, sb *wire.Sandbox) (time.Duration, error) {
	r, err := c.Run(ctx, sb, "", "TIMEFORMAT=%3R; { time bash -l -c true; } 2>&1")
	if err != nil {
		return 0, err
	}
	sec, err := strconv.ParseFloat(strings.TrimSpace(r.Stdout), 64)
	if err != nil {
		return 0, fmt.Errorf("inside timing %q: %w", r.Stdout, err)
	}
	return time.Duration(sec * float64(time.Second)), nil
}

// mountTemplate mounts the template's layers read-only on a new directory.
func mountTemplate(layers []string) (string, func(), error) {
	if len(layers) == 0 {
		return "", nil, fmt.Errorf("template has no rootfs layers")
	}
	root, err := os.MkdirTemp("", "agentbox-bench-shell-")
	if err != nil {
		return "", nil, err
	}
	lower := slices.Clone(layers)
	slices.Reverse(lower)
	if len(lower) == 1 {
		err = unix.Mount(lower[0], root, "", unix.MS_BIND|unix.MS_RDONLY, "")
	} else {
		// Only lower layers: overlayfs mounts them read-only.
		err = unix.Mount("overlay", root, "overlay", unix.MS_RDONLY, "lowerdir="+strings.Join(lower, ":"))
	}
	if err != nil {
		os.Remove(root)
		return "", nil, fmt.Errorf("mount template rootfs: %w", err)
	}
	return root, func() { _ = unix.Unmount(root, unix.MNT_DETACH); os.Remove(root) }, nil
}

// shellOnce times one `bash -l -c true` chrooted in root.
func shellOnce(ctx context.Context, root string) (time.Duration, error) {
	cmd := exec.CommandContext(ctx, "/bin/bash", "-l", "-c", "true")
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"}
	start := time.Now()
	if b, err := cmd.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("bash -l -c true in the template: %w: %s", err, b)
	}
	return time.Since(start), nil
}

// commandFloor is what a command round trip is held to: `bash -l -c true`
// chrooted in the template plus one loopback HTTP exchange.
type commandFloor struct {
	root string // the template's layers, mounted read-only
	srv  *httptest.Server
	hc   *http.Client
}

// newCommandFloor mounts the template's layers and starts the loopback
// HTTP server; close undoes both.
func newCommandFloor(ctx context.Context, layers []string) (*commandFloor, func(), error) {
	root, unmount, err := mountTemplate(layers)
	if err != nil {
		return nil, nil, err
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
	f := &commandFloor{root: root, srv: srv, hc: srv.Client()}
	closeAll := func() { srv.Close(); unmount() }
	if _, err := f.httpOnce(ctx); err != nil { // dials
		closeAll()
		return nil, nil, err
	}
	return f, closeAll, nil
}

// httpOnce times one small request and response on the kept-alive
// connection.
func (f *commandFloor) httpOnce(ctx context.Context) (time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, f.srv.URL, nil)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	resp, err := f.hc.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return time.Since(start), nil
}

// commandSamples are n round trips of `true` in a sandbox and their floor,
// sampled alternately.
type commandSamples struct {
	rtt, floor, hostShell []time.Duration
	// With detail: the same shell timed inside the sandbox by bash, and
	// envd's round trip without a process (GET /health).
	inside, health []time.Duration
	errs           int
}

// sample runs n round trips (after three warm-up commands), each next to
// one floor sample.
func (f *commandFloor) sample(ctx context.Context, c *wire.Client, sb *wire.Sandbox, n int, detail bool, log *slog.Logger) (commandSamples, error) {
	var s commandSamples
	for i := range n + 3 {
		sh, err := shellOnce(ctx, f.root)
		if err != nil {
			return s, err
		}
		lb, err := f.httpOnce(ctx)
		if err != nil {
			return s, err
		}
		start := time.Now()
		r, err := c.Run(ctx, sb, "", "true")
		d := time.Since(start)
		if i < 3 { // warm-up: the first commands of a sandbox
			continue
		}
		if err != nil || r.ExitCode != 0 {
			s.errs++
			log.Warn("command", "err", err)
			continue
		}
		s.rtt = append(s.rtt, d)
		s.floor = append(s.floor, sh+lb)
		s.hostShell = append(s.hostShell, sh)
		if !detail {
			continue
		}
		if in, err := insideOnce(ctx, c, sb); err == nil {
			s.inside = append(s.inside, in)
		}
		t := time.Now()
		if err := c.EnvdHealth(ctx, sb); err == nil {
			s.health = append(s.health, time.Since(t))
		}
	}
	return s, nil
}
