package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

type built struct {
	root, agentbox, envd string
}

// binaries builds agentbox and a static envd once per test process (the
// process is the unit: package-level state is the only way to share work
// between its tests). Each process builds its own copy: packages run
// concurrently, and a rebuild of bin/ under a running server breaks it.
var binaries = sync.OnceValues(func() (built, error) {
	root, err := repoRoot()
	if err != nil {
		return built{}, err
	}
	base := filepath.Join(os.TempDir(), "agentbox-e2e-bin")
	if err := os.MkdirAll(base, 0o755); err != nil {
		return built{}, err
	}
	sweepDeadBinDirs(base)
	dir := filepath.Join(base, strconv.Itoa(os.Getpid()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return built{}, err
	}
	// 0755 all the way: host-user attacks run the CLI as nobody.
	_ = os.Chmod(dir, 0o755)
	b := built{root: root, agentbox: filepath.Join(dir, "agentbox"), envd: filepath.Join(dir, "envd")}
	for _, x := range []struct {
		out, pkg string
		env      []string
	}{
		{b.agentbox, "./cmd/agentbox", nil},
		{b.envd, "./cmd/envd", []string{"CGO_ENABLED=0"}},
	} {
		cmd := exec.Command("go", "build", "-trimpath", "-o", x.out, x.pkg)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), x.env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return built{}, fmt.Errorf("go build %s: %w\n%s", x.pkg, err, out)
		}
	}
	return b, nil
})

// sweepDeadBinDirs removes the binaries of test processes that have exited.
func sweepDeadBinDirs(base string) {
	ents, _ := os.ReadDir(base)
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			_ = os.RemoveAll(filepath.Join(base, e.Name()))
		}
	}
}

// Binaries returns the paths of the agentbox and envd binaries built for
// this test process (building them on first use), e.g. to run the CLI
// before a server starts.
func Binaries(t testing.TB) (agentbox, envd string) {
	t.Helper()
	b, err := binaries()
	if err != nil {
		t.Fatal(err)
	}
	return b.agentbox, b.envd
}

// repoRoot is the directory holding go.mod, above the test's working dir.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

// RepoRoot is the repository root (the directory holding go.mod).
func RepoRoot(t testing.TB) string {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

var npmOnce sync.Map // dir → func() error

// NPMInstall runs `npm ci` in dir once per test process, unless npm's own
// record of the install (node_modules/.package-lock.json) is newer than
// package.json and package-lock.json. Processes of other packages that share
// dir wait on a lock file instead of installing over each other.
func NPMInstall(t testing.TB, dir string) {
	t.Helper()
	f, _ := npmOnce.LoadOrStore(dir, sync.OnceValue(func() error { return npmCI(dir) }))
	if err := f.(func() error)(); err != nil {
		t.Fatal(err)
	}
}

func npmCI(dir string) error {
	lock, err := os.OpenFile(filepath.Join(dir, ".npm-ci.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return err
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if fresh(filepath.Join(dir, "node_modules", ".package-lock.json"), filepath.Join(dir, "package.json"), filepath.Join(dir, "package-lock.json")) {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("npm ci in %s: %w\n%s", dir, err, out)
	}
	return nil
}

// fresh reports whether target exists and is newer than every source.
func fresh(target string, sources ...string) bool {
	ti, err := os.Stat(target)
	if err != nil {
		return false
	}
	for _, s := range sources {
		si, err := os.Stat(s)
		if err != nil || si.ModTime().After(ti.ModTime()) {
			return false
		}
	}
	return true
}

// AsNobody returns a command that runs name with args as the unprivileged
// host user nobody:nogroup without supplementary groups, for attacks from a
// host user. The caller must be root.
func AsNobody(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "setpriv", append([]string{"--reuid=nobody", "--regid=nogroup", "--clear-groups", "--", name}, args...)...)
}

// NobodyShell is AsNobody for a shell script (sh -c script).
func NobodyShell(ctx context.Context, script string) *exec.Cmd {
	return AsNobody(ctx, "sh", "-c", script)
}
