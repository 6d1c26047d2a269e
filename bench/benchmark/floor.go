package benchmark

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// runcFloor times what a sandbox start cannot beat on this host: mount an
// overlay of the template's layers, `runc run` /bin/true in it, unmount. It
// returns one duration per run.
func runcFloor(ctx context.Context, layers []string, n int) ([]time.Duration, error) {
	if len(layers) == 0 {
		return nil, fmt.Errorf("template has no rootfs layers")
	}
	work, err := os.MkdirTemp("", "agentbox-bench-floor-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	state := filepath.Join(work, "runc")
	bundle := filepath.Join(work, "bundle")
	if err := os.MkdirAll(bundle, 0o755); err != nil {
		return nil, err
	}
	if err := writeSpec(ctx, bundle); err != nil {
		return nil, err
	}
	// overlayfs wants the upper layer first.
	lower := slices.Clone(layers)
	slices.Reverse(lower)
	lowerdir := strings.Join(lower, ":")

	var out []time.Duration
	for i := range n {
		upper, wk := filepath.Join(work, "upper"), filepath.Join(work, "work")
		rootfs := filepath.Join(bundle, "rootfs")
		for _, d := range []string{upper, wk, rootfs} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return nil, err
			}
		}
		start := time.Now()
		opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", lowerdir, upper, wk)
		if err := unix.Mount("overlay", rootfs, "overlay", 0, opts); err != nil {
			return nil, fmt.Errorf("mount overlay: %w", err)
		}
		cmd := exec.CommandContext(ctx, "runc", "--root", state, "run", "--bundle", bundle, fmt.Sprintf("bench-floor-%d-%d", os.Getpid(), i))
		runOut, runErr := cmd.CombinedOutput()
		umErr := unix.Unmount(rootfs, unix.MNT_DETACH)
		elapsed := time.Since(start)
		if runErr != nil {
			return nil, fmt.Errorf("runc run: %w: %s", runErr, runOut)
		}
		if umErr != nil {
			return nil, fmt.Errorf("unmount: %w", umErr)
		}
		out = append(out, elapsed)
		if err := os.RemoveAll(upper); err != nil {
			return nil, err
		}
		if err := os.RemoveAll(wk); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// writeSpec writes runc's default spec with /bin/true as the process and no
// terminal.
func writeSpec(ctx context.Context, bundle string) error {
	if out, err := exec.CommandContext(ctx, "runc", "spec", "--bundle", bundle).CombinedOutput(); err != nil {
		return fmt.Errorf("runc spec: %w: %s", err, out)
	}
	path := filepath.Join(bundle, "config.json")
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var spec map[string]any
	if err := json.Unmarshal(data, &spec); err != nil {
		return err
	}
	proc := spec["process"].(map[string]any)
	proc["terminal"] = false
	proc["args"] = []string{"/bin/true"}
	data, err = json.Marshal(spec)
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

// execFloor times fork+exec+wait of /bin/true on the host: the least a
// command round trip can cost.
func execFloor(ctx context.Context, n int) ([]time.Duration, error) {
	var out []time.Duration
	for range n {
		start := time.Now()
		if err := exec.CommandContext(ctx, "/bin/true").Run(); err != nil {
			return nil, err
		}
		out = append(out, time.Since(start))
	}
	return out, nil
}

// diskFloor writes data to a file in dir, fsync'd, and returns how long
// that took: the floor of an upload.
func diskFloor(dir string, data []byte) (time.Duration, error) {
	f, err := os.CreateTemp(dir, "agentbox-bench-disk-")
	if err != nil {
		return 0, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	start := time.Now()
	if _, err := f.Write(data); err != nil {
		return 0, err
	}
	if err := f.Sync(); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// shellFloor times fork+exec+wait of what the SDK runs for a command,
// `/bin/bash -l -c true`, chrooted into a read-only overlay of the
// template's layers (the same shell and profile a sandbox runs).
func shellFloor(ctx context.Context, layers []string, n int) ([]time.Duration, error) {
	root, unmount, err := mountTemplate(layers) // commands.go
	if err != nil {
		return nil, err
	}
	defer unmount()
	var out []time.Duration
	for range n {
		cmd := exec.CommandContext(ctx, "/bin/bash", "-l", "-c", "true")
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
		cmd.Dir = "/"
		cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"}
		start := time.Now()
		if b, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("bash -l -c true in the template: %w: %s", err, b)
		}
		out = append(out, time.Since(start))
	}
	return out, nil
}

// loopbackFloor times one small HTTP request and response over loopback
// with a kept-alive connection: what any remote command must add.
func loopbackFloor(ctx context.Context, n int) ([]time.Duration, error) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	defer srv.Close()
	client := srv.Client()
	var out []time.Duration
	for i := range n + 1 {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
		if err != nil {
			return nil, err
		}
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			return nil, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if i > 0 { // the first one dials
			out = append(out, time.Since(start))
		}
	}
	return out, nil
}
