package benchmark

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/agentbox/agentbox/e2e/wire"
)

// SoakConfig is a long mixed workload against one server.
type SoakConfig struct {
	APIURL   string
	Keys     []string // one API key per team; the workers take turns
	Template string   // default "base"
	Ops      int      // operations in all (default 2000)
	Workers  int      // cycles in flight (default 2)
	Every    int      // print a sample every this many operations (default Ops/10)
	Host     HostScope
}

// SoakResult is what a soak measured: the samples printed and the
// operations that failed (by kind).
type SoakResult struct {
	Ops      int
	Failed   map[string]int
	FirstErr map[string]string
	Baseline HostSample
	Samples  []HostSample
	After    HostSample // once every object of the workload is gone
}

// Soak runs cfg.Ops operations of the mixed cycle create → command → file
// write → pause → resume → snapshot → fork → kill the fork → kill →
// delete the snapshot, several teams taking turns, and prints the server's
// and the host's counts (HostSample) before, every cfg.Every operations
// and after. A failing operation ends its cycle (what it made is killed)
// and is counted; the soak goes on.
func Soak(ctx context.Context, cfg SoakConfig, w io.Writer) (SoakResult, error) {
	if cfg.Template == "" {
		cfg.Template = "base"
	}
	if cfg.Ops <= 0 {
		cfg.Ops = 2000
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 2
	}
	if cfg.Every <= 0 {
		cfg.Every = max(1, cfg.Ops/10)
	}
	if len(cfg.Keys) == 0 {
		return SoakResult{}, errors.New("soak: no API key")
	}
	res := SoakResult{Failed: map[string]int{}, FirstErr: map[string]string{}}
	res.Baseline = cfg.Host.Sample()
	fmt.Fprintf(w, "%-8s %s\n", "ops", HostHeader())
	fmt.Fprintf(w, "%-8d %s\n", 0, res.Baseline)

	var done atomic.Int64
	var mu sync.Mutex
	fail := func(kind string, err error) {
		mu.Lock()
		defer mu.Unlock()
		res.Failed[kind]++
		if _, ok := res.FirstErr[kind]; !ok {
			res.FirstErr[kind] = err.Error()
		}
	}
	tick := func() bool {
		n := done.Add(1)
		if n%int64(cfg.Every) == 0 {
			s := cfg.Host.Sample()
			mu.Lock()
			res.Samples = append(res.Samples, s)
			fmt.Fprintf(w, "%-8d %s\n", n, s)
			mu.Unlock()
		}
		return n < int64(cfg.Ops) && ctx.Err() == nil
	}
	more := func() bool { return done.Load() < int64(cfg.Ops) && ctx.Err() == nil }
	// One client per team for the whole soak: a client per cycle would
	// leave its kept-alive connections open on the server (until its idle
	// timeout) and read as a leak.
	clients := make([]*wire.Client, len(cfg.Keys))
	for i, k := range cfg.Keys {
		clients[i] = wire.New(cfg.APIURL, k)
	}
	var wg sync.WaitGroup
	for i := range cfg.Workers {
		wg.Go(func() {
			for cycle := i; ; cycle += cfg.Workers {
				c := clients[cycle%len(clients)]
				if !soakCycle(ctx, cfg, c, tick, more, fail) {
					return
				}
			}
		})
	}
	wg.Wait()
	for _, c := range clients {
		c.HTTP.CloseIdleConnections()
	}
	http.DefaultClient.CloseIdleConnections() // apiJSON's
	res.Ops = int(done.Load())
	res.After = cfg.Host.Sample()
	fmt.Fprintf(w, "%-8s %s\n", "after", res.After)
	for kind, n := range res.Failed {
		fmt.Fprintf(w, "failed %s: %d (first: %s)\n", kind, n, res.FirstErr[kind])
	}
	return res, ctx.Err()
}

// soakCycle runs one cycle as c's team; it returns false when the soak
// has done its operations.
func soakCycle(ctx context.Context, cfg SoakConfig, c *wire.Client, tick, more func() bool, fail func(string, error)) bool {
	lc := LifecycleConfig{APIURL: cfg.APIURL, APIKey: c.APIKey}
	// Cleanup runs whatever the cycle got to; a context of its own so a
	// cancelled soak still leaves nothing behind.
	clean := context.WithoutCancel(ctx)
	var kill []string
	snapshot := ""
	defer func() {
		for _, id := range kill {
			if err := c.Kill(clean, id); err != nil && !isNotFound(err) {
				fail("cleanup kill", err)
			}
		}
		if snapshot != "" {
			if err := apiJSON(clean, lc, http.MethodDelete, "/templates/"+url.PathEscape(snapshot), nil, nil); err != nil {
				fail("delete snapshot", err)
			}
		}
	}()
	// step runs one operation; false ends the cycle (it failed, or the
	// soak has done its operations).
	step := func(kind string, f func() error) bool {
		err := f()
		if err != nil {
			fail(kind, err)
		}
		return tick() && err == nil
	}
	var sb *wire.Sandbox
	if !step("create", func() (err error) {
		sb, err = c.Create(ctx, wire.CreateRequest{TemplateID: cfg.Template, Timeout: 600, Metadata: map[string]string{"soak": "1"}})
		if err == nil {
			kill = append(kill, sb.SandboxID)
		}
		return err
	}) {
		return more()
	}
	if !step("command", func() error {
		r, err := c.Run(ctx, sb, "", "echo soak-$((6*7))")
		if err == nil && !strings.Contains(r.Stdout, "soak-42") {
			err = fmt.Errorf("command printed %q", r.Stdout)
		}
		return err
	}) {
		return more()
	}
	if !step("file write", func() error {
		body := strings.Repeat("soak ", 20000)
		return c.Upload(ctx, sb, "/tmp/soak.txt", strings.NewReader(body), int64(len(body)))
	}) {
		return more()
	}
	if !step("pause", func() error {
		return apiJSON(ctx, lc, http.MethodPost, "/sandboxes/"+sb.SandboxID+"/pause", nil, nil)
	}) {
		return more()
	}
	if !step("resume", func() error {
		return apiJSON(ctx, lc, http.MethodPost, "/v2/sandboxes/"+sb.SandboxID+"/connect", map[string]any{"timeout": 600}, nil)
	}) {
		return more()
	}
	if !step("snapshot", func() error {
		var out struct {
			SnapshotID string `json:"snapshotID"`
		}
		err := apiJSON(ctx, lc, http.MethodPost, "/sandboxes/"+sb.SandboxID+"/snapshots", map[string]any{}, &out)
		snapshot = out.SnapshotID
		return err
	}) {
		return more()
	}
	if !step("fork", func() error {
		var out []struct {
			Sandbox *wire.Sandbox `json:"sandbox"`
			Error   *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := apiJSON(ctx, lc, http.MethodPost, "/sandboxes/"+sb.SandboxID+"/fork", map[string]any{"count": 1, "timeout": 300}, &out); err != nil {
			return err
		}
		for _, f := range out {
			if f.Sandbox != nil {
				kill = append(kill, f.Sandbox.SandboxID)
			} else if f.Error != nil {
				return errors.New(f.Error.Message)
			}
		}
		return nil
	}) {
		return more()
	}
	// The kills: one operation each, forks first; what a failure leaves,
	// the deferred cleanup kills.
	for len(kill) > 0 {
		id := kill[len(kill)-1]
		if !step("kill", func() error { return c.Kill(ctx, id) }) {
			return more() // the deferred cleanup kills what is left
		}
		kill = kill[:len(kill)-1]
	}
	return more()
}

func isNotFound(err error) bool {
	var we *wire.Error
	return errors.As(err, &we) && we.Status == http.StatusNotFound
}
