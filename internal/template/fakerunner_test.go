package template

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

// fakeRunner stands in for the sandbox manager's StepRunner: it simulates
// each command by writing into UpperDir, as a step sandbox's writable layer
// would be captured. Commands:
//
//	fake-write <path> <text>   writes text to <path> (relative to /, or to
//	                           the workdir); {user}, {wd}, {team} and
//	                           {env:K} expand ({team}: what the team's own
//	                           network policy and credentials would fetch)
//	fake-fail <code> <text>    prints text and exits with code
//	fake-block                 waits until release is closed or ctx ends
//
// Anything else fails, so a test cannot pass by accident.
type fakeRunner struct {
	mu      sync.Mutex
	reqs    []StepRequest
	release chan struct{}
	started chan struct{} // receives once per fake-block
}

type exitErr int

func (e exitErr) Error() string { return fmt.Sprintf("exit status %d", int(e)) }
func (e exitErr) ExitCode() int { return int(e) }

func (f *fakeRunner) calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.reqs)
}

func (f *fakeRunner) RunSteps(ctx context.Context, req StepRequest) error {
	f.mu.Lock()
	f.reqs = append(f.reqs, req)
	f.mu.Unlock()
	if _, err := os.Stat(req.UpperDir); err == nil {
		return fmt.Errorf("UpperDir %s exists", req.UpperDir)
	}
	if err := os.Mkdir(req.UpperDir, 0o755); err != nil {
		return err
	}
	for _, c := range req.Commands {
		verb, rest, _ := strings.Cut(strings.TrimSpace(c.Cmd), " ")
		switch verb {
		case "fake-write":
			p, text, _ := strings.Cut(rest, " ")
			text = strings.NewReplacer("{user}", c.User, "{wd}", c.Workdir, "{team}", req.TeamID).Replace(text)
			for k, v := range c.Env {
				text = strings.ReplaceAll(text, "{env:"+k+"}", v)
			}
			if !strings.HasPrefix(p, "/") {
				p = filepath.Join(c.Workdir, p)
			}
			full := filepath.Join(req.UpperDir, p)
			if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
				return err
			}
			if err := os.WriteFile(full, []byte(text+"\n"), 0o644); err != nil {
				return err
			}
		case "fake-fail":
			code, text, _ := strings.Cut(rest, " ")
			n, _ := strconv.Atoi(code)
			fmt.Fprintln(req.Output, text)
			return fmt.Errorf("line %d: %w", c.Line, exitErr(n))
		case "fake-block":
			if f.started != nil {
				f.started <- struct{}{}
			}
			select {
			case <-f.release:
			case <-ctx.Done():
				return ctx.Err()
			}
		default:
			return fmt.Errorf("fake runner: unknown command %q", c.Cmd)
		}
	}
	return nil
}
