package benchmark

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/agentbox/agentbox/e2e/wire"
)

// LargeFileConfig is one large-file round trip through the official e2b JS
// SDK (e2e/js/largefile.mjs).
type LargeFileConfig struct {
	APIURL, APIKey string
	Template       string // default "base"
	SizeMB         int    // MiB each way
	JSDir          string // e2e/js, with its node_modules
	ServerPID      int    // the server whose peak RSS is measured; 0: none
	FloorDir       string // where the raw floor writes its file (the server's disk); default os.TempDir()
}

// LargeFileResult is what a round trip measured. Peak RSS is VmHWM: the
// server's is reset before the transfer (clear_refs), envd's is its peak
// since the sandbox started (envd's /proc entries are not the sandbox's to
// reset), which for a fresh sandbox is the transfer's.
type LargeFileResult struct {
	Bytes               int64
	Up, Down            time.Duration
	ServerBeforeKB      int64 // the server's RSS before the transfer
	ServerPeakKB        int64 // the server's peak RSS during it
	EnvdPeakKB          int64
	FloorUp, FloorDown  time.Duration // writing then reading the same size on the host's disk
	SandboxID, Template string
}

// Rate is MB/s over d.
func (r LargeFileResult) Rate(d time.Duration) float64 {
	return float64(r.Bytes) / 1e6 / d.Seconds()
}

// LargeFile creates a sandbox, streams cfg.SizeMB into it and back through
// the JS SDK while the server's peak RSS is tracked, reads envd's peak, and
// times the raw floor. The sandbox is killed at the end.
func LargeFile(ctx context.Context, cfg LargeFileConfig) (LargeFileResult, error) {
	res := LargeFileResult{Template: cfg.Template}
	if res.Template == "" {
		res.Template = "base"
	}
	c := wire.New(cfg.APIURL, cfg.APIKey)
	sb, err := c.Create(ctx, wire.CreateRequest{TemplateID: res.Template, Timeout: 3600, Metadata: map[string]string{"bench": "largefile"}})
	if err != nil {
		return res, err
	}
	res.SandboxID = sb.SandboxID
	defer func() { _ = c.Kill(context.WithoutCancel(ctx), sb.SandboxID) }()
	if cfg.ServerPID > 0 {
		res.ServerBeforeKB = statusKB(cfg.ServerPID, "VmRSS")
		// "5" resets the peak to the current RSS (proc(5), clear_refs).
		if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", cfg.ServerPID), []byte("5"), 0); err != nil {
			return res, fmt.Errorf("reset the server's peak RSS: %w", err)
		}
	}
	cmd := exec.CommandContext(ctx, "node", "largefile.mjs")
	cmd.Dir = cfg.JSDir
	cmd.Env = append(os.Environ(), "E2B_API_URL="+cfg.APIURL, "E2B_SANDBOX_URL="+cfg.APIURL, "E2B_API_KEY="+cfg.APIKey,
		"SANDBOX_ID="+sb.SandboxID, "SIZE_MB="+strconv.Itoa(cfg.SizeMB))
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return res, fmt.Errorf("node largefile.mjs: %w: %s", err, nodeError(string(ee.Stderr)))
		}
		return res, fmt.Errorf("node largefile.mjs: %w", err)
	}
	var js struct {
		Sent, Got              int64
		UpSeconds, DownSeconds float64
		Same                   bool
	}
	if err := json.Unmarshal([]byte(lastLine(string(out))), &js); err != nil {
		return res, fmt.Errorf("largefile.mjs printed %q: %w", lastLine(string(out)), err)
	}
	if js.Sent != js.Got || !js.Same {
		return res, fmt.Errorf("round trip changed the file: sent %d bytes, got %d, same hash %v", js.Sent, js.Got, js.Same)
	}
	res.Bytes = js.Sent
	res.Up, res.Down = time.Duration(js.UpSeconds*float64(time.Second)), time.Duration(js.DownSeconds*float64(time.Second))
	if cfg.ServerPID > 0 {
		res.ServerPeakKB = statusKB(cfg.ServerPID, "VmHWM")
	}
	// envd is the sandbox's PID 1; its status is readable from inside.
	r, err := c.Run(ctx, sb, "root", "grep VmHWM /proc/1/status")
	if err != nil {
		return res, fmt.Errorf("envd's peak RSS: %w", err)
	}
	res.EnvdPeakKB = parseStatusKB(r.Stdout, "VmHWM")
	res.FloorUp, res.FloorDown, err = largeFileFloor(ctx, cfg.FloorDir, res.Bytes)
	return res, err
}

// largeFileFloor writes n random bytes to a file on dir's disk, then reads it
// back, as `dd` then `cat` would: what no transfer into a sandbox on this
// disk can beat.
func largeFileFloor(ctx context.Context, dir string, n int64) (up, down time.Duration, err error) {
	f, err := os.CreateTemp(dir, "agentbox-bench-largefile-")
	if err != nil {
		return 0, 0, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	buf := make([]byte, 1<<20)
	t0 := time.Now()
	for left := n; left > 0; left -= int64(len(buf)) {
		if ctx.Err() != nil {
			return 0, 0, ctx.Err()
		}
		b := buf[:min(int64(len(buf)), left)]
		_, _ = rand.Read(b) // the SDK's side makes random bytes too
		if _, err := f.Write(b); err != nil {
			return 0, 0, err
		}
	}
	up = time.Since(t0)
	t0 = time.Now()
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return 0, 0, err
	}
	if _, err := io.CopyBuffer(io.Discard, f, buf); err != nil {
		return 0, 0, err
	}
	return up, time.Since(t0), nil
}

// statusKB reads one "<key>: N kB" line of /proc/<pid>/status.
func statusKB(pid int, key string) int64 {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return 0
	}
	return parseStatusKB(string(b), key)
}

func parseStatusKB(status, key string) int64 {
	sc := bufio.NewScanner(strings.NewReader(status))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), key+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb
		}
	}
	return 0
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// nodeError is the line of node's stderr that says what failed: node ends
// an uncaught error with its own version line, which says nothing.
func nodeError(stderr string) string {
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if l != "" && !strings.HasPrefix(l, "Node.js v") && !strings.HasPrefix(l, "at ") && !strings.HasPrefix(l, "}") {
			return l
		}
	}
	return lastLine(stderr)
}
