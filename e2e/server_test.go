package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/agentbox/agentbox/e2e/wire"
)

// server is one `agentbox serve` process under test. A restart keeps the
// data dir, the port and the key; only the process changes.
type server struct {
	root        string // repository root
	bin         string // bin/agentbox
	envd        string // bin/envd
	dataDir     string
	templateDir string
	addr        string // 127.0.0.1:PORT
	logPath     string
	instance    string // --instance: names the runc root, netns dir, nftables table, cgroup parent
	apiKey      string
	otherKey    string // key of a second team
	cmd         *exec.Cmd
	exited      chan struct{}
}

func (s *server) url() string { return "http://" + s.addr }

func (s *server) client() *wire.Client { return wire.New(s.url(), s.apiKey) }

// env is the environment the E2B SDKs and our CLI read.
func (s *server) env() []string {
	return append(os.Environ(),
		"E2B_API_URL="+s.url(),
		"E2B_SANDBOX_URL="+s.url(),
		"E2B_API_KEY="+s.apiKey,
		"E2E_OTHER_API_KEY="+s.otherKey,
	)
}

func repoRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	return filepath.Dir(wd), nil // tests run in e2e/
}

// build runs `make build` at the repository root.
func build(ctx context.Context, root string) error {
	cmd := exec.CommandContext(ctx, "make", "build")
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("make build: %w\n%s", err, out)
	}
	return nil
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// start launches the server and waits until /health answers and the API key
// exists. The first start on a machine builds the base template, hence the
// generous wait.
func (s *server) start(ctx context.Context) error {
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(logf, "\n===== serve started %s =====\n", time.Now().Format(time.RFC3339))
	cmd := exec.Command(s.bin, "serve",
		"--data-dir", s.dataDir,
		"--listen", s.addr,
		"--template-dir", s.templateDir,
		"--envd", s.envd,
		// Own instance, bridge and subnet, so a developer's server on the
		// same host and this one never touch each other's sandboxes.
		"--instance", s.instance,
		"--bridge", "abe2e0",
		"--subnet", "10.213.0.0/16",
	)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = s.root
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start serve: %w", err)
	}
	s.cmd = cmd
	s.exited = make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(s.exited)
	}()

	deadline := time.Now().Add(15 * time.Minute)
	for {
		select {
		case <-s.exited:
			return fmt.Errorf("serve exited before it was ready: %v", cmd.ProcessState)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return errors.New("serve not healthy after 15 minutes")
		}
		key, err := os.ReadFile(filepath.Join(s.dataDir, "apikey"))
		if err != nil {
			continue
		}
		s.apiKey = strings.TrimSpace(string(key))
		hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = s.client().Health(hctx)
		cancel()
		if err == nil {
			return nil
		}
	}
}

// stop sends sig and waits for the process to go.
func (s *server) stop(sig syscall.Signal) error {
	if s.cmd == nil || s.cmd.Process == nil {
		return nil
	}
	_ = s.cmd.Process.Signal(sig)
	select {
	case <-s.exited:
	case <-time.After(2 * time.Minute):
		_ = s.cmd.Process.Kill()
		<-s.exited
		return fmt.Errorf("serve ignored %v for 2 minutes", sig)
	}
	return nil
}

var keyPattern = regexp.MustCompile(`e2b_[0-9a-f]{16,}`)

// createKey mints a key for team with the CLI (`agentbox apikey create`).
func (s *server) createKey(ctx context.Context, team string) (string, error) {
	cmd := exec.CommandContext(ctx, s.bin, "apikey", "create", "--data-dir", s.dataDir, "--team", team)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("apikey create: %w\n%s", err, out)
	}
	k := keyPattern.FindString(string(out))
	if k == "" {
		return "", fmt.Errorf("apikey create printed no key: %s", out)
	}
	return k, nil
}

// logTail returns the last n lines of the server log.
func (s *server) logTail(n int) string {
	f, err := os.Open(s.logPath)
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
