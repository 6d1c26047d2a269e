package benchmark

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/agentbox/agentbox/e2e/wire"
)

// ServerConfig is a server the bench starts for itself: its own instance,
// bridge, subnet and data dir, so that it touches nothing of another
// server on the host.
type ServerConfig struct {
	Bin, Envd   string // the agentbox and envd binaries (make build)
	TemplateDir string // shared template store (read; the base template is built there if missing)
	Instance    string
	Bridge      string
	Subnet      string // a prefix no interface of the host is in; room for the density rows
	Dir         string // parent of the data dir and the log; "" makes a temporary one
	Pool        string // warm pool, <template>=<min>
	PoolMax     int
	// DataDiskMB > 0 puts the data dir on a tmpfs of its own of that
	// size, so it can be filled without touching the host's disk.
	DataDiskMB int
	Args       []string // more serve flags
}

// Server is a running server the bench started.
type Server struct {
	URL, APIKey, DataDir, MetricsURL, LogPath string
	PID                                       int

	cfg    ServerConfig
	dir    string
	args   []string // every start's flags
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited
}

// StartServer starts `agentbox serve` with cfg and waits until it answers.
func StartServer(ctx context.Context, cfg ServerConfig, log *slog.Logger) (*Server, error) {
	if err := subnetFree(cfg.Subnet, cfg.Bridge); err != nil {
		return nil, err
	}
	for _, p := range []struct{ name, path string }{{"agentbox", cfg.Bin}, {"envd", cfg.Envd}} {
		if _, err := os.Stat(p.path); err != nil {
			return nil, fmt.Errorf("%s binary %s (run make build): %w", p.name, p.path, err)
		}
	}
	dir := cfg.Dir
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "agentbox-bench-"); err != nil {
			return nil, err
		}
	} else if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	// Traversable like /var/lib: the server's own modes guard its data
	// dir against host users.
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	api, err := freeAddr()
	if err != nil {
		return nil, err
	}
	metrics, err := freeAddr()
	if err != nil {
		return nil, err
	}
	s := &Server{URL: "http://" + api, DataDir: filepath.Join(dir, "data"), MetricsURL: "http://" + metrics + "/metrics",
		LogPath: filepath.Join(dir, "serve.log"), cfg: cfg, dir: dir}
	s.args = []string{"serve", "--data-dir", s.DataDir, "--listen", api, "--metrics-listen", metrics,
		"--template-dir", cfg.TemplateDir, "--envd", cfg.Envd, "--instance", cfg.Instance, "--bridge", cfg.Bridge, "--subnet", cfg.Subnet}
	s.args = append(s.args, cfg.Args...)
	if cfg.DataDiskMB > 0 {
		if err := os.MkdirAll(s.DataDir, 0o700); err != nil {
			return s, err
		}
		opts := fmt.Sprintf("size=%dm,mode=0700", cfg.DataDiskMB)
		if err := syscall.Mount("tmpfs", s.DataDir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, opts); err != nil {
			return s, fmt.Errorf("mount a %d MiB tmpfs on %s: %w", cfg.DataDiskMB, s.DataDir, err)
		}
	}
	var extra []string
	if cfg.Pool != "" {
		extra = []string{"--pool", cfg.Pool, "--pool-max", strconv.Itoa(cfg.PoolMax)}
	}
	log.Info("bench server starting", "url", s.URL, "instance", cfg.Instance, "bridge", cfg.Bridge, "subnet", cfg.Subnet, "log", s.LogPath)
	return s, s.launch(ctx, extra)
}

// launch starts the server process with the base flags and extra, and
// waits until it answers.
func (s *Server) launch(ctx context.Context, extra []string) error {
	logf, err := os.OpenFile(s.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	s.cmd = exec.Command(s.cfg.Bin, append(slices.Clone(s.args), extra...)...)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	// AGENTBOX_<FLAG> would set serve flags behind the bench's back.
	s.cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "AGENTBOX_") })
	if err := s.cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", s.cfg.Bin, err)
	}
	s.PID = s.cmd.Process.Pid
	exited := make(chan struct{})
	s.exited = exited
	go func(cmd *exec.Cmd) {
		_ = cmd.Wait()
		logf.Close()
		close(exited)
	}(s.cmd)
	return s.waitReady(ctx, 15*time.Minute)
}

// terminate stops the process with SIGTERM and waits for it.
func (s *Server) terminate() error {
	if !s.running() {
		return nil
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
		return nil
	case <-time.After(2 * time.Minute):
		_ = s.cmd.Process.Kill()
		<-s.exited
		return errors.New("serve ignored SIGTERM for 2 minutes")
	}
}

func (s *Server) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		select {
		case <-s.exited:
			return fmt.Errorf("serve exited before it was ready (%v); log %s", s.cmd.ProcessState, s.LogPath)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("serve not healthy after %s; log %s", timeout, s.LogPath)
		}
		key, err := os.ReadFile(filepath.Join(s.DataDir, "apikey"))
		if err != nil {
			continue
		}
		s.APIKey = strings.TrimSpace(string(key))
		hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = wire.New(s.URL, s.APIKey).Health(hctx)
		cancel()
		if err == nil {
			return nil
		}
	}
}

// Stop kills every sandbox of the server, stops it, removes its host
// state (nftables tables, bridge, /run/<instance>, its cgroup parents) and
// the data dir, and returns what it could not remove.
func (s *Server) Stop(ctx context.Context) error {
	var errs []error
	if s.running() {
		errs = append(errs, s.killSandboxes(ctx), s.terminate())
	}
	if s.cfg.Pool != "" && s.exited != nil {
		// Warm pool members outlive a stop, like every sandbox; a start
		// without the pool drains them.
		if err := s.launch(ctx, nil); err != nil {
			errs = append(errs, fmt.Errorf("start without the pool to drain it: %w", err))
		}
		netns := filepath.Join("/run", s.cfg.Instance, "netns")
		for deadline := time.Now().Add(time.Minute); countEntries(netns) > 0 && time.Now().Before(deadline); {
			time.Sleep(250 * time.Millisecond)
		}
		errs = append(errs, s.terminate())
	}
	inst := s.cfg.Instance
	for _, fam := range []string{"inet", "bridge"} {
		_ = exec.Command("nft", "delete", "table", fam, inst).Run()
	}
	_ = exec.Command("ip", "link", "del", s.cfg.Bridge).Run()
	run := filepath.Join("/run", inst)
	for _, m := range mountsUnder(run) {
		// The gVisor driver's empty netns for restores, pinned for the
		// server's life.
		if filepath.Base(m) == "null-netns" {
			_ = syscall.Unmount(m, syscall.MNT_DETACH)
		}
	}
	if m := mountsUnder(run); len(m) > 0 {
		errs = append(errs, fmt.Errorf("still mounted under %s: %v", run, m))
	} else {
		_ = os.RemoveAll(run)
	}
	removeCgroups(inst)
	if s.cfg.DataDiskMB > 0 && slices.Contains(mountsUnder(s.DataDir), s.DataDir) {
		if err := syscall.Unmount(s.DataDir, 0); err != nil {
			errs = append(errs, fmt.Errorf("unmount the data disk %s: %w", s.DataDir, err))
		}
	}
	if m, _ := filepath.Glob("/sys/fs/cgroup/*/" + inst); len(m) > 0 {
		errs = append(errs, fmt.Errorf("cgroups left: %v", m))
	}
	if m := mountsUnder(s.DataDir); len(m) > 0 {
		errs = append(errs, fmt.Errorf("keeping %s, still mounted: %v", s.dir, m))
	} else if err := errors.Join(errs...); err == nil {
		errs = append(errs, os.RemoveAll(s.dir))
	}
	return errors.Join(errs...)
}

func (s *Server) running() bool {
	if s.exited == nil {
		return false
	}
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

// killSandboxes kills every sandbox the server lists (warm pool members
// are the server's own and go with it).
func (s *Server) killSandboxes(ctx context.Context) error {
	c := wire.New(s.URL, s.APIKey)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/sandboxes", nil)
	if err != nil {
		return err
	}
	req.Header.Set("X-API-Key", s.APIKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("list sandboxes to kill them: %w", err)
	}
	defer resp.Body.Close()
	var list []struct {
		SandboxID string `json:"sandboxID"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return fmt.Errorf("list sandboxes to kill them: %s: %w", resp.Status, err)
	}
	var errs []error
	for _, sb := range list {
		if err := c.Kill(ctx, sb.SandboxID); err != nil && !wire.IsStatus(err, http.StatusNotFound) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeCgroups removes the instance's empty cgroup directories under
// every hierarchy, deepest first.
func removeCgroups(instance string) {
	roots, _ := filepath.Glob("/sys/fs/cgroup/*/" + instance)
	if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", instance)); err == nil {
		roots = append(roots, filepath.Join("/sys/fs/cgroup", instance))
	}
	for _, root := range roots {
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for _, d := range slices.Backward(dirs) {
			_ = syscall.Rmdir(d)
		}
	}
}

// mountsUnder lists the mount points at or below dir.
func mountsUnder(dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for line := range strings.SplitSeq(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			out = append(out, f[4])
		}
	}
	return out
}

// subnetFree fails when an interface other than bridge has an address in
// subnet: sandboxes would shadow it.
func subnetFree(subnet, bridge string) error {
	p, err := netip.ParsePrefix(subnet)
	if err != nil {
		return fmt.Errorf("--own-subnet %q: %w", subnet, err)
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return err
	}
	for _, ifc := range ifs {
		if ifc.Name == bridge {
			continue
		}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if q, err := netip.ParsePrefix(a.String()); err == nil && q.Masked().Overlaps(p) {
				return fmt.Errorf("--own-subnet %s overlaps %s on %s: pick a free prefix", subnet, a, ifc.Name)
			}
		}
	}
	return nil
}

// freeAddr is a free 127.0.0.1 port.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}
