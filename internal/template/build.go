package template

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// Build builds the operator's definition def into the store with
// mmdebstrap and returns the template (owned by no team: a builtin). The
// template ID is the hash of def, so when that template exists already
// Build returns it without building. A definition with a Base is built as
// layers over it whose commands run through runner (see OperatorRunner).
// progress receives human-readable build output (nil discards it).
// Bootstraps are serialized per store directory, also across processes,
// with a lock file that only other bootstraps take.
func (s *Store) Build(ctx context.Context, def Definition, runner StepRunner, progress io.Writer) (*Template, error) {
	if progress == nil {
		progress = io.Discard
	}
	if err := s.admitDisk("build a template"); err != nil {
		return nil, err
	}
	def, err := def.Normalize()
	if err != nil {
		return nil, err
	}
	id, err := def.ID()
	if err != nil {
		return nil, err
	}
	if t, err := s.load(id); err == nil {
		fmt.Fprintf(progress, "template %s (%s) is cached, built %s\n", def.Name, id, t.CreatedAt.Format(time.RFC3339))
		return t, nil
	}
	if def.Base != nil {
		return s.buildLayered(ctx, def, id, runner, progress)
	}

	unlock, err := s.lockDir(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	// Another process may have finished the same build while we waited.
	if t, err := s.load(id); err == nil {
		fmt.Fprintf(progress, "template %s (%s) is cached\n", def.Name, id)
		return t, nil
	}
	bw, err := s.newBuildWork(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("build %s: %w", def.Name, err)
	}
	defer bw.close(ctx)
	// The template dir is made inside the work dir and renamed out.
	work := filepath.Join(bw.dir, id)
	if err := os.Mkdir(work, 0o700); err != nil {
		return nil, fmt.Errorf("build %s: %w", def.Name, err)
	}

	start := time.Now()
	s.log.InfoContext(ctx, "template build started", "name", def.Name, "id", id, "packages", len(def.Packages))
	rootfs := filepath.Join(work, rootfsDir)
	steps := []struct {
		name string
		run  func() error
	}{
		{fmt.Sprintf("bootstrap Debian %s with %d packages (mmdebstrap)", def.Suite, len(def.Packages)),
			func() error { return bootstrap(ctx, def, rootfs, progress) }},
		{fmt.Sprintf("add user %s (uid 1000, passwordless sudo)", def.DefaultUser),
			func() error { return addUser(ctx, def, rootfs, progress) }},
		{"finalize rootfs", func() error { return finalize(def, rootfs) }},
	}
	if len(def.Run) > 0 {
		// Before finalize, which drops the caches the commands may fill.
		steps = slices.Insert(steps, len(steps)-1, struct {
			name string
			run  func() error
		}{fmt.Sprintf("run %d build command(s)", len(def.Run)), func() error { return runBuildCommands(ctx, def.Run, rootfs, progress) }})
	}
	for i, st := range steps {
		stepStart := time.Now()
		fmt.Fprintf(progress, "==> [%d/%d] %s\n", i+1, len(steps), st.name)
		if err := st.run(); err != nil {
			return nil, fmt.Errorf("build %s: %s: %w", def.Name, st.name, err)
		}
		fmt.Fprintf(progress, "    done in %.1fs\n", time.Since(stepStart).Seconds())
	}

	size, err := diskUsage(rootfs)
	if err != nil {
		return nil, fmt.Errorf("build %s: measure rootfs: %w", def.Name, err)
	}
	t := &Template{
		ID:             id,
		Aliases:        []string{def.Name},
		Tags:           []string{"default"},
		CPUCount:       def.CPUCount,
		MemoryMB:       def.MemoryMB,
		DiskMB:         def.DiskMB,
		DefaultUser:    def.DefaultUser,
		DefaultWorkdir: def.DefaultWorkdir,
		Env:            def.Env,
		StartCmd:       def.StartCmd,
		ReadyCmd:       def.ReadyCmd,
		SizeBytes:      size,
		BuildSeconds:   time.Since(start).Seconds(),
		CreatedAt:      time.Now().UTC(),
		Definition:     &def,
	}
	if err := writeMeta(work, t); err != nil {
		return nil, fmt.Errorf("build %s: %w", def.Name, err)
	}
	final := filepath.Join(s.dir, id)
	if err := os.Rename(work, final); err != nil {
		return nil, fmt.Errorf("build %s: install: %w", def.Name, err)
	}
	t.Layers = []string{filepath.Join(final, rootfsDir)}
	fmt.Fprintf(progress, "built %s (%s) in %.0fs, %d MB\n", def.Name, id, t.BuildSeconds, size/1e6)
	s.log.InfoContext(ctx, "template built", "name", def.Name, "id", id,
		"seconds", t.BuildSeconds, "bytes", size)
	return t, nil
}

func bootstrap(ctx context.Context, def Definition, rootfs string, progress io.Writer) error {
	if _, err := exec.LookPath("mmdebstrap"); err != nil {
		return fmt.Errorf("mmdebstrap is not installed (apt-get install mmdebstrap): %w", errdefs.ErrUnavailable)
	}
	args := []string{
		"--variant=minbase",
		"--mode=root",
		"--aptopt=APT::Install-Recommends \"false\"",
		"--aptopt=Acquire::Languages \"none\"",
		"--dpkgopt=path-exclude=/usr/share/doc/*",
		"--dpkgopt=path-include=/usr/share/doc/*/copyright",
		"--dpkgopt=path-exclude=/usr/share/man/*",
		"--dpkgopt=path-exclude=/usr/share/info/*",
	}
	if len(def.Packages) > 0 {
		args = append(args, "--include="+strings.Join(def.Packages, ","))
	}
	args = append(args, def.Suite, rootfs)
	if def.Mirror != "" {
		args = append(args, def.Mirror)
	}
	cmd := exec.CommandContext(ctx, "mmdebstrap", args...)
	// SIGTERM lets mmdebstrap unmount what it mounted in the rootfs.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	return runStreaming(cmd, progress)
}

// addUser creates the default user inside the rootfs with the rootfs's own
// tools, so its uid/gid land in the template's passwd files.
func addUser(ctx context.Context, def Definition, rootfs string, progress io.Writer) error {
	u := def.DefaultUser
	args := []string{rootfs, "useradd", "--create-home", "--home-dir", "/home/" + u,
		"--shell", "/bin/bash", "--uid", "1000", "--user-group"}
	if hasGroup(rootfs, "sudo") {
		args = append(args, "--groups", "sudo")
	}
	args = append(args, u)
	if err := runStreaming(exec.CommandContext(ctx, "chroot", args...), progress); err != nil {
		return err
	}
	sudoers := filepath.Join(rootfs, "etc/sudoers.d")
	if err := os.MkdirAll(sudoers, 0o750); err != nil {
		return err
	}
	line := u + " ALL=(ALL:ALL) NOPASSWD: ALL\n"
	if err := os.WriteFile(filepath.Join(sudoers, u), []byte(line), 0o440); err != nil {
		return err
	}
	if def.DefaultWorkdir != "/home/"+u {
		wd := filepath.Join(rootfs, def.DefaultWorkdir)
		if err := os.MkdirAll(wd, 0o755); err != nil {
			return err
		}
		if err := os.Chown(wd, 1000, 1000); err != nil {
			return err
		}
	}
	return nil
}

// finalize drops caches and prepares mount points the runtime binds over.
func finalize(def Definition, rootfs string) error {
	for _, pattern := range []string{
		"var/lib/apt/lists/*", "var/cache/apt/*.bin", "var/cache/apt/archives/*.deb",
		"var/log/apt/*", "var/log/*.log", "tmp/*", "var/tmp/*",
	} {
		matches, err := filepath.Glob(filepath.Join(rootfs, pattern))
		if err != nil {
			return err
		}
		for _, m := range matches {
			if filepath.Base(m) == "lock" || filepath.Base(m) == "partial" {
				continue
			}
			if err := os.RemoveAll(m); err != nil {
				return err
			}
		}
	}
	for _, d := range []string{".agentbox", ".agentbox/bin", "run", "proc", "sys", "dev"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			return err
		}
	}
	// Files the runtime bind-mounts per sandbox must exist as files.
	for _, f := range []string{"etc/resolv.conf", "etc/hosts", "etc/hostname"} {
		p := filepath.Join(rootfs, f)
		if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
			if err := os.WriteFile(p, nil, 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

func runStreaming(cmd *exec.Cmd, progress io.Writer) error {
	cmd.Stdin = nil
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	copied := make(chan struct{})
	var tail []string // last lines, for the error message
	go func() {
		defer close(copied)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			fmt.Fprintf(progress, "    %s\n", sc.Text())
			tail = append(tail, sc.Text())
			if len(tail) > 5 {
				tail = tail[1:]
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	err := cmd.Run()
	pw.Close()
	<-copied
	if err != nil {
		return fmt.Errorf("%s: %w: %s", filepath.Base(cmd.Path), err, strings.Join(tail, " | "))
	}
	return nil
}

func hasGroup(rootfs, name string) bool {
	b, err := os.ReadFile(filepath.Join(rootfs, "etc/group"))
	if err != nil {
		return false
	}
	for line := range strings.Lines(string(b)) {
		if strings.HasPrefix(line, name+":") {
			return true
		}
	}
	return false
}

// lockDir serializes bootstraps of builtins (operator builds) per store
// directory, also across processes. Team builds never take it.
func (s *Store) lockDir(ctx context.Context) (func(), error) {
	return flockFile(ctx, filepath.Join(s.dir, lockFile), unix.LOCK_EX)
}

// removeTree detaches any mount left below dir (a killed mmdebstrap can
// leave /proc or /dev mounted in the rootfs) before deleting it, so the
// deletion never reaches into the host's /proc or /dev.
func removeTree(dir string) error {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err == nil {
		var mounts []string
		for line := range strings.Lines(string(b)) {
			f := strings.Fields(line)
			if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
				mounts = append(mounts, f[4])
			}
		}
		// Deepest first.
		slices.SortFunc(mounts, func(a, b string) int { return len(b) - len(a) })
		for _, m := range mounts {
			if err := unix.Unmount(m, unix.MNT_DETACH); err != nil {
				return fmt.Errorf("unmount %s: %w", m, err)
			}
		}
	}
	return os.RemoveAll(dir)
}

// diskUsage is the allocated size of the tree, counting hard links once.
func diskUsage(root string) (int64, error) {
	type inode struct{ dev, ino uint64 }
	seen := map[inode]bool{}
	var total int64
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		k := inode{uint64(st.Dev), st.Ino}
		if seen[k] {
			return nil
		}
		seen[k] = true
		total += st.Blocks * 512
		return nil
	})
	return total, err
}
