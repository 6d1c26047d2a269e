// Package harness runs a real `agentbox serve` for end-to-end tests. Every
// e2e package uses it, so that all of them build the binaries the same way,
// start servers that never collide, and clean up after themselves.
//
// A server gets its own data dir, a free 127.0.0.1 port, and an instance
// name, bridge and /24 subnet derived from a hash of (repository root,
// package, suite name): suites of different worktrees and packages can run
// on one host without touching each other's sandboxes, nftables tables or
// bridges. Templates come from the shared cache /var/cache/agentbox/templates
// (or $AGENTBOX_TEMPLATE_DIR), so the base template is built once per host.
//
//	func TestX(t *testing.T) {
//		s := harness.Start(t)                    // one server for this test
//		other := s.NewKey(t, "other")            // a second team
//		cmd.Env = s.Env(s.APIKey)                // E2B_API_URL, E2B_SANDBOX_URL, E2B_VOLUME_API_URL, E2B_API_KEY
//	}
//
// A server shared by every test of a package is a [Suite]. Servers are torn
// down by t.Cleanup (or Suite.Close): every sandbox they know of is killed,
// the process stopped, and the host state of the instance removed; on failure
// the tail of the server log is printed.
//
// Two runs of one package in one worktree would share an instance: the
// harness holds a lock per instance name under /run/agentbox-e2e from start
// to teardown and refuses the second run, naming the first. It also refuses
// to start a server while the disk of its data dir or template cache has
// less than DefaultMinFreeMB free ($AGENTBOX_E2E_MIN_FREE_MB).
//
// End-to-end tests need root; run them serialised machine-wide:
//
//	flock /tmp/agentbox-e2e.lock go test -count=1 ./e2e/...
package harness

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/testutil"
)

// DefaultTemplateDir is the template cache shared by every server on a host.
const DefaultTemplateDir = "/var/cache/agentbox/templates"

// readyTimeout bounds a start: the first start on a host builds the base
// template (1-2 minutes, longer on a busy machine).
const readyTimeout = 15 * time.Minute

// RequireRoot skips t without root, or fails it when AGENTBOX_REQUIRE_ROOT=1
// (CI), so that a root-only test can never pass by being skipped there.
func RequireRoot(t testing.TB) {
	t.Helper()
	testutil.RequireRoot(t)
}

// Option configures a server.
type Option func(*config)

type config struct {
	name        string
	args        []string
	env         []string
	templateDir string
	dataDiskMB  int // datadisk.go
	// ownTemplateDisk: templateDir is a filesystem of the test's own
	// (templatedisk.go).
	ownTemplateDisk bool
}

// Args adds serve flags to every start of the server. Flags for one start
// only (e.g. --pool, --fault-step) go to [Server.Launch] or [Server.Restart].
func Args(args ...string) Option { return func(c *config) { c.args = append(c.args, args...) } }

// Env adds KEY=VALUE pairs to the server's environment.
func Env(kv ...string) Option { return func(c *config) { c.env = append(c.env, kv...) } }

// TemplateDir replaces the shared template cache (pass --build-base=false
// with Args when the dir has no base template and none should be built).
func TemplateDir(dir string) Option { return func(c *config) { c.templateDir = dir } }

// Name names the suite for the instance hash (default: the test's name).
func Name(name string) Option { return func(c *config) { c.name = name } }

// Server is one `agentbox serve` process under test. A restart keeps the
// data dir, port, instance and keys; only the process changes.
type Server struct {
	URL         string // http://127.0.0.1:PORT: API and data plane
	Addr        string // 127.0.0.1:PORT
	APIKey      string // the first team's key (<data-dir>/apikey)
	DataDir     string
	TemplateDir string
	Instance    string // --instance: runc root, netns dir, nftables table, cgroup parent
	Bridge      string
	Subnet      netip.Prefix
	Root        string // repository root
	Bin, Envd   string // the binaries built for this test process
	LogPath     string

	cfg     config
	mu      sync.Mutex
	keys    []string // every key minted, for the teardown's sweep
	cmd     *exec.Cmd
	extra   []string // per-run flags of the current process
	exited  chan struct{}
	stopped bool
	// lock is held from start to teardown (lock.go).
	lock *instanceLock
}

// Start starts a server for t and tears it down when t ends. It skips t in
// -short mode and without root (see [RequireRoot]).
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end tests skipped in -short mode")
	}
	RequireRoot(t)
	cfg := config{name: t.Name()}
	for _, o := range opts {
		o(&cfg)
	}
	s, err := start(cfg)
	if s != nil {
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("----- agentbox serve log %s (last 150 lines) -----\n%s", s.LogPath, s.LogTail(150))
			}
			if err := s.teardown(); err != nil {
				t.Errorf("teardown: %v", err)
			}
		})
	}
	if err != nil {
		t.Fatalf("start agentbox serve: %v", err)
	}
	return s
}

func start(cfg config) (*Server, error) {
	// The variables the SDKs and the CLI read to find a server: a test
	// names its own server explicitly (Env), so one exported in the shell
	// that runs the tests must not redirect it.
	for _, k := range []string{"E2B_API_URL", "E2B_SANDBOX_URL", "E2B_VOLUME_API_URL", "E2B_API_KEY", "E2B_DOMAIN", "AGENTBOX_API_URL", "AGENTBOX_API_KEY"} {
		os.Unsetenv(k)
	}
	b, err := binaries()
	if err != nil {
		return nil, err
	}
	wd, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	pkg, err := filepath.Rel(b.root, wd)
	if err != nil {
		return nil, err
	}
	h := sha256.Sum256([]byte(b.root + "\x00" + pkg + "\x00" + cfg.name))
	tag := hex.EncodeToString(h[:])
	subnet, err := freeSubnet(uint16(h[0])<<8|uint16(h[1]), "abx"+tag[:10])
	if err != nil {
		return nil, err
	}
	if cfg.templateDir == "" {
		cfg.templateDir = cmpOr(os.Getenv("AGENTBOX_TEMPLATE_DIR"), DefaultTemplateDir)
	}
	if err := os.MkdirAll(cfg.templateDir, 0o755); err != nil {
		return nil, err
	}
	minMB, err := minFreeMB()
	if err != nil {
		return nil, err
	}
	disks := map[string]string{"the data dir's parent": os.TempDir(), "the template cache": cfg.templateDir}
	if cfg.ownTemplateDisk {
		delete(disks, "the template cache")
	}
	if err := checkFreeSpace(minMB, disks); err != nil {
		return nil, err
	}
	instance := "e2e-" + sanitize(filepath.Base(pkg)) + "-" + tag[:8]
	lock, err := lockInstance(LockDir, instance)
	if err != nil {
		return nil, err
	}
	// The data dir's parent is traversable by everyone, like /var/lib: the
	// server's own permissions, not the harness's, guard the data dir
	// against host users.
	parent, err := os.MkdirTemp("", "agentbox-e2e-")
	if err != nil {
		lock.release()
		return nil, err
	}
	addr, err := freeAddr()
	if err == nil {
		err = os.Chmod(parent, 0o755)
	}
	if err != nil {
		lock.release()
		return nil, err
	}
	s := &Server{
		URL:         "http://" + addr,
		Addr:        addr,
		DataDir:     filepath.Join(parent, "data"),
		TemplateDir: cfg.templateDir,
		Instance:    instance,
		Bridge:      "abx" + tag[:10],
		Subnet:      subnet,
		Root:        b.root,
		Bin:         b.agentbox,
		Envd:        b.envd,
		LogPath:     filepath.Join(parent, "serve.log"),
		cfg:         cfg,
		lock:        lock,
	}
	if err := s.mountDataDisk(); err != nil {
		lock.release()
		return nil, err
	}
	if err := s.launch(nil); err != nil {
		return s, err
	}
	s.keys = append(s.keys, s.APIKey)
	return s, nil
}

// PID is the running server's process id (0 when it is not running).
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.cmd.Process == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Env is the environment of the E2B SDKs and the agentbox CLI for key:
// os.Environ() plus E2B_API_URL, E2B_SANDBOX_URL, E2B_VOLUME_API_URL (the
// volume content API) and E2B_API_KEY.
func (s *Server) Env(key string) []string {
	return append(os.Environ(), "E2B_API_URL="+s.URL, "E2B_SANDBOX_URL="+s.URL, "E2B_VOLUME_API_URL="+s.URL, "E2B_API_KEY="+key)
}

var keyPattern = regexp.MustCompile(`e2b_[0-9a-f]{16,}`)

// NewKey mints a key of team (created if new) with `agentbox apikey create`.
func (s *Server) NewKey(t testing.TB, team string) string {
	t.Helper()
	out, err := exec.Command(s.Bin, "apikey", "create", "--data-dir", s.DataDir, "--team", team).CombinedOutput()
	if err != nil {
		t.Fatalf("agentbox apikey create --team %s: %v\n%s", team, err, out)
	}
	k := keyPattern.FindString(string(out))
	if k == "" {
		t.Fatalf("agentbox apikey create printed no key: %s", out)
	}
	s.mu.Lock()
	s.keys = append(s.keys, k)
	s.mu.Unlock()
	return k
}

// Do sends one API request with key (X-API-Key; none when empty) and a JSON
// body (none when nil), and returns the status and the body read.
func (s *Server) Do(ctx context.Context, key, method, path string, body any) (int, []byte, error) {
	return s.DoHeader(ctx, key, method, path, body, nil)
}

// DoHeader is Do with extra request headers.
func (s *Server) DoHeader(ctx context.Context, key, method, path string, body any, header http.Header) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.URL+path, rd)
	if err != nil {
		return 0, nil, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// Launch starts the server process again after [Server.Terminate],
// [Server.Kill9] or a crash; extra flags apply to this run only.
func (s *Server) Launch(t testing.TB, extra ...string) {
	t.Helper()
	if err := s.launch(extra); err != nil {
		t.Fatalf("launch agentbox serve: %v\n%s", err, s.LogTail(60))
	}
}

// Restart stops the process with SIGTERM (sandboxes keep running) and
// launches it again with extra flags for the new run.
func (s *Server) Restart(t testing.TB, extra ...string) {
	t.Helper()
	s.Terminate(t)
	s.Launch(t, extra...)
}

// Terminate stops the process with SIGTERM and waits; its sandboxes keep
// running, as in production.
func (s *Server) Terminate(t testing.TB) {
	t.Helper()
	if err := s.signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
}

// Kill9 kills the process with SIGKILL and waits; its sandboxes keep running.
func (s *Server) Kill9(t testing.TB) {
	t.Helper()
	if err := s.signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
}

// Stop tears the server down for good: it kills every sandbox of every key
// it minted, stops the process and removes the instance's host state. It
// runs by itself at cleanup; calling it twice is harmless.
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	if err := s.teardown(); err != nil {
		t.Error(err)
	}
}

// Exited is closed when the current process has exited (e.g. at an injected
// fault).
func (s *Server) Exited() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.exited
}

// ProcessState is the state of the last process that exited (nil while it
// runs).
func (s *Server) ProcessState() *os.ProcessState {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return nil
	}
	return s.cmd.ProcessState
}

func (s *Server) running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
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

func (s *Server) launch(extra []string) error {
	if s.running() {
		return errors.New("already running")
	}
	logf, err := os.OpenFile(s.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	fmt.Fprintf(logf, "\n===== serve %v started %s =====\n", extra, time.Now().Format(time.RFC3339))
	args := []string{"serve",
		"--data-dir", s.DataDir,
		"--listen", s.Addr,
		"--template-dir", s.TemplateDir,
		"--envd", s.Envd,
		"--instance", s.Instance,
		"--bridge", s.Bridge,
		"--subnet", s.Subnet.String(),
	}
	args = append(append(args, s.cfg.args...), extra...)
	cmd := exec.Command(s.Bin, args...)
	cmd.Dir = s.Root
	cmd.Stdout, cmd.Stderr = logf, logf
	// AGENTBOX_<FLAG> and AGENTBOX_CONFIG would set serve flags behind the
	// test's back.
	cmd.Env = append(slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "AGENTBOX_") }), s.cfg.env...)
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", s.Bin, err)
	}
	exited := make(chan struct{})
	s.mu.Lock()
	s.cmd, s.exited, s.extra = cmd, exited, extra
	s.mu.Unlock()
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(exited)
	}()

	deadline := time.Now().Add(readyTimeout)
	for {
		select {
		case <-exited:
			return fmt.Errorf("serve exited before it was ready (%v); log %s", cmd.ProcessState, s.LogPath)
		case <-time.After(250 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("serve not healthy after %v; log %s", readyTimeout, s.LogPath)
		}
		key, err := os.ReadFile(filepath.Join(s.DataDir, "apikey"))
		if err != nil {
			continue
		}
		s.APIKey = strings.TrimSpace(string(key))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, _, err := s.Do(ctx, "", http.MethodGet, "/health", nil)
		cancel()
		if err == nil && st == http.StatusOK {
			return nil
		}
	}
}

// signal sends sig to the running process and waits for it to exit.
func (s *Server) signal(sig syscall.Signal) error {
	if !s.running() {
		return nil
	}
	s.mu.Lock()
	p, exited := s.cmd.Process, s.exited
	s.mu.Unlock()
	_ = p.Signal(sig)
	select {
	case <-exited:
		return nil
	case <-time.After(2 * time.Minute):
		_ = p.Kill()
		<-exited
		return fmt.Errorf("serve ignored %v for 2 minutes", sig)
	}
}

// teardown kills every sandbox (a plain launch first, so that a crashed
// server's sandboxes are adopted and a warm pool from per-run flags is
// drained), stops the server, and removes the instance's host state and the
// data dir when nothing is left mounted.
func (s *Server) teardown() error {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return nil
	}
	s.stopped = true
	keys := slices.Clone(s.keys)
	plain := len(s.extra) == 0
	s.mu.Unlock()
	// Released whatever is left: the next run's teardown of this instance
	// removes what this one could not.
	defer s.lock.release()

	var errs []error
	if s.running() && !plain {
		errs = append(errs, s.signal(syscall.SIGTERM))
	}
	if !s.running() {
		if err := s.launch(nil); err != nil {
			errs = append(errs, fmt.Errorf("launch to clean up: %w", err))
		}
	}
	if s.running() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		for _, key := range keys {
			st, b, err := s.Do(ctx, key, http.MethodGet, "/sandboxes", nil)
			var list []struct {
				SandboxID string `json:"sandboxID"`
			}
			if err != nil || st != http.StatusOK || json.Unmarshal(b, &list) != nil {
				errs = append(errs, fmt.Errorf("list sandboxes to kill them: %d %s %v", st, b, err))
				continue
			}
			for _, sb := range list {
				if st, b, err := s.Do(ctx, key, http.MethodDelete, "/sandboxes/"+sb.SandboxID, nil); err != nil || (st != http.StatusNoContent && st != http.StatusNotFound) {
					errs = append(errs, fmt.Errorf("kill sandbox %s: %d %s %v", sb.SandboxID, st, b, err))
				}
			}
		}
		cancel()
		errs = append(errs, s.signal(syscall.SIGTERM))
	}
	if err := errors.Join(errs...); err != nil {
		// Something may still run; leave its host state for the next start.
		return err
	}
	// The server leaves its host setup for sandboxes that outlive it; this
	// one's are all gone.
	for _, fam := range []string{"inet", "bridge"} {
		_ = exec.Command("nft", "delete", "table", fam, s.Instance).Run()
	}
	_ = exec.Command("ip", "link", "del", s.Bridge).Run()
	run := filepath.Join("/run", s.Instance)
	if m, err := MountsUnder(run); err == nil {
		// The gVisor driver's empty netns for restores is pinned here;
		// with no sandbox left, nothing needs it.
		for _, p := range m {
			if filepath.Base(p) == "null-netns" {
				_ = syscall.Unmount(p, syscall.MNT_DETACH)
			}
		}
	}
	if m, err := MountsUnder(run); err == nil && len(m) == 0 {
		_ = os.RemoveAll(run)
	}
	if m, err := MountsUnder(s.DataDir); err == nil && len(m) == 1 && m[0] == s.DataDir {
		if err := s.unmountDataDisk(); err != nil {
			return err
		}
	}
	if m, err := MountsUnder(s.DataDir); err != nil || len(m) > 0 {
		return fmt.Errorf("keeping %s, still mounted: %v %v", s.DataDir, m, err)
	}
	return os.RemoveAll(filepath.Dir(s.DataDir))
}

// LogTail returns the last n lines of the server log.
func (s *Server) LogTail(n int) string {
	f, err := os.Open(s.LogPath)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

// MountsUnder lists the mount points at or below dir (also through
// symlinks in dir's path).
func MountsUnder(dir string) ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	dirs := []string{dir}
	if real, err := filepath.EvalSymlinks(dir); err == nil && real != dir {
		dirs = append(dirs, real)
	}
	var out []string
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && slices.ContainsFunc(dirs, func(d string) bool { return f[4] == d || strings.HasPrefix(f[4], d+"/") }) {
			out = append(out, f[4])
		}
	}
	return out, nil
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// freeSubnet picks a /24 in 10.160.0.0/12 (4096 of them; no default or
// hand-picked test subnet lies there) starting at index h, skipping any that
// overlaps an address of a host interface other than bridge.
func freeSubnet(h uint16, bridge string) (netip.Prefix, error) {
	var taken []netip.Prefix
	ifs, err := net.Interfaces()
	if err != nil {
		return netip.Prefix{}, err
	}
	for _, ifc := range ifs {
		if ifc.Name == bridge {
			continue
		}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil {
				taken = append(taken, p.Masked())
			}
		}
	}
	for i := range 4096 {
		n := (int(h) + i) % 4096
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(160 + n/256), byte(n % 256), 0}), 24)
		if !slices.ContainsFunc(taken, p.Overlaps) {
			return p, nil
		}
	}
	return netip.Prefix{}, errors.New("no free /24 in 10.160.0.0/12")
}

func sanitize(s string) string {
	s = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' {
			return r
		}
		return '-'
	}, strings.ToLower(s))
	return s[:min(len(s), 20)]
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
