package main

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/agentbox/agentbox/internal/sandbox"
)

// lifecycleFlags are the serve settings of pause/resume, snapshots and
// warm pools.
type lifecycleFlags struct {
	SnapshotDir string
	Pools       []string
	PoolMax     int
	IdleFreeze  time.Duration
	FaultStep   string
	CrashAfter  string
	// FailEgressEvery: see failEgressProxy.
	FailEgressEvery time.Duration
}

func addLifecycleFlags(f *pflag.FlagSet, l *lifecycleFlags) {
	f.StringVar(&l.SnapshotDir, "snapshot-dir", "", "where snapshots (captured writable layer + memory image) are kept (default <data-dir>/snapshots)")
	f.StringSliceVar(&l.Pools, "pool", nil, "warm pool as <template>=<min size>, e.g. base=2 (repeatable); creates of that template claim a ready sandbox; the pool grows by the largest burst of creates seen within 2 s (or what the last five minutes' rate needs) and shrinks back after five quiet minutes")
	f.IntVar(&l.PoolMax, "pool-max", 16, "largest size a warm pool grows to under load (a burst of N is absorbed whole only with --pool-max >= N plus the minimum)")
	f.DurationVar(&l.IdleFreeze, "idle-freeze", 0, "freeze (cgroup freezer, memory kept) sandboxes with no data-plane traffic for this long; traffic thaws them in milliseconds (0 = never)")
	f.StringVar(&l.FaultStep, "fault-step", "", "exit at this named lifecycle step (crash-safety tests)")
	_ = f.MarkHidden("fault-step")
	f.StringVar(&l.CrashAfter, "test-crash-after", "", "kill the server (SIGKILL) right after this step, as <operation>/<step> (crash-safety tests; never read from the environment or a config file)")
	_ = f.MarkHidden("test-crash-after")
	f.DurationVar(&l.FailEgressEvery, "test-fail-egress-proxy", 0, "close the egress proxy's listener under the running server this often, as a crash of it would (fault tests; never read from the environment or a config file)")
	_ = f.MarkHidden("test-fail-egress-proxy")
}

// parsePools reads --pool values.
func parsePools(vals []string) (map[string]int, error) {
	out := map[string]int{}
	for _, v := range vals {
		name, size, ok := strings.Cut(v, "=")
		n, err := strconv.Atoi(size)
		if !ok || name == "" || err != nil || n < 0 || n > 1000 {
			return nil, fmt.Errorf("--pool %q: want <template>=<size from 0 to 1000>, e.g. base=2", v)
		}
		out[name] = n
	}
	return out, nil
}

// lifecycleConfig is the manager's lifecycle settings from the serve flags.
func lifecycleConfig(c serveConfig) (sandbox.LifecycleConfig, error) {
	l := c.Lifecycle
	pools, err := parsePools(l.Pools)
	if err != nil {
		return sandbox.LifecycleConfig{}, err
	}
	if l.SnapshotDir == "" {
		l.SnapshotDir = filepath.Join(c.DataDir, "snapshots")
	}
	return sandbox.LifecycleConfig{
		SnapshotDir: l.SnapshotDir, IdleFreeze: l.IdleFreeze, Pools: pools, PoolMax: l.PoolMax, FaultStep: cmp.Or(l.CrashAfter, l.FaultStep),
	}, nil
}

// pinEnvd copies the envd binary to <data-dir>/envd/<sha256> and returns
// that path. Sandboxes bind-mount it, so rebuilding or upgrading envd never
// unlinks the file running sandboxes map: CRIU cannot checkpoint a process
// whose executable was deleted (pause, snapshot and fork would fail).
func pinEnvd(src, dataDir string) (string, error) {
	f, err := os.Open(src)
	if err != nil {
		return "", fmt.Errorf("envd: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("envd: %w", err)
	}
	dir := filepath.Join(dataDir, "envd")
	dst := filepath.Join(dir, hex.EncodeToString(h.Sum(nil))[:16])
	if _, err := os.Stat(dst); err == nil {
		return dst, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("envd: %w", err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(dir, ".envd-*")
	if err != nil {
		return "", fmt.Errorf("envd: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, f); err != nil {
		tmp.Close()
		return "", fmt.Errorf("envd: %w", err)
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return "", fmt.Errorf("envd: %w", err)
	}
	return dst, nil
}
