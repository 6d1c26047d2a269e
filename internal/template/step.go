package template

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
)

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// buildNet is the network RUN steps of one build share.
type buildNet struct {
	netns   string // "" = the host's network namespace
	dns     []string
	release func()
}

func (s *Store) setupBuildNet(ctx context.Context, fn NetworkFunc, buildID string) (*buildNet, error) {
	if fn == nil {
		return &buildNet{release: func() {}}, nil
	}
	ns, dns, release, err := fn(ctx, buildID)
	if err != nil {
		return nil, fmt.Errorf("build network: %w", err)
	}
	return &buildNet{netns: ns, dns: dns, release: release}, nil
}

// runLayerStep runs one RUN, COPY or WORKDIR step on an overlay of the
// current layers with upper as the new, empty upper layer.
func (s *Store) runLayerStep(ctx context.Context, spec BuildSpec, step Step, st *buildState, upper string, net *buildNet, buildID string, progress io.Writer) error {
	work := filepath.Dir(upper)
	lowers := make([]string, 0, len(st.LayerIDs))
	for _, ref := range st.LayerIDs {
		p, err := s.layerRefPath(ref)
		if err != nil {
			return err
		}
		lowers = append(lowers, p)
	}
	merged, unmount, err := mountOverlay(work, lowers, upper)
	if err != nil {
		return err
	}
	defer unmount()
	root, err := os.OpenRoot(merged)
	if err != nil {
		return err
	}
	defer root.Close()
	switch step.Op {
	case OpWorkdir:
		if err := root.MkdirAll(strings.TrimPrefix(st.Workdir, "/"), 0o755); err != nil && st.Workdir != "/" {
			return fmt.Errorf("create %s: %w", st.Workdir, err)
		}
		return nil
	case OpCopy:
		if step.FilesHash != "" {
			dir := filepath.Join(work, "context")
			if err := s.extractUpload(ctx, step.FilesHash, dir); err != nil {
				return err
			}
			step.ContextDir = dir
		}
		uid, gid := 0, 0
		if step.User != "" {
			u, err := lookupUser(root, step.User)
			if err != nil {
				return err
			}
			uid, gid = int(u.uid), int(u.gid)
		}
		var mode fs.FileMode
		if step.Mode != "" {
			m, err := strconv.ParseUint(step.Mode, 8, 32)
			if err != nil || m > 0o7777 {
				return fmt.Errorf("mode %q: want octal permissions", step.Mode)
			}
			mode = fs.FileMode(m) & fs.ModePerm
		}
		dest := step.Dest
		if !path.IsAbs(dest) {
			dest = path.Join("/", st.Workdir, dest) + map[bool]string{true: "/"}[strings.HasSuffix(dest, "/")]
		}
		n, err := copySources(step, root, dest, uid, gid, mode)
		if err != nil {
			return err
		}
		fmt.Fprintf(progress, "    copied %d files\n", n)
		return nil
	case OpRun:
		return runStepInRootfs(ctx, spec, step, st, merged, root, work, net, buildID, progress)
	}
	return fmt.Errorf("not a layer step: %s", step.Op)
}

// mountOverlay mounts lowers (lowest first) under upper at work/merged.
func mountOverlay(work string, lowers []string, upper string) (string, func(), error) {
	ovlWork := filepath.Join(work, "work")
	merged := filepath.Join(work, "merged")
	for _, d := range []string{ovlWork, merged} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return "", nil, err
		}
	}
	if len(lowers) == 0 {
		empty := filepath.Join(work, "empty")
		if err := os.MkdirAll(empty, 0o755); err != nil {
			return "", nil, err
		}
		lowers = []string{empty}
	}
	top := slices.Clone(lowers)
	slices.Reverse(top) // overlay lists the topmost lower first
	opts := "lowerdir=" + strings.Join(top, ":") + ",upperdir=" + upper + ",workdir=" + ovlWork
	if len(opts) > 4000 {
		return "", nil, fmt.Errorf("%d layers are more than one overlay mount can stack: %w", len(lowers), errdefs.ErrResourceExhausted)
	}
	if err := unix.Mount("overlay", merged, "overlay", 0, opts); err != nil {
		return "", nil, fmt.Errorf("mount overlay: %w", err)
	}
	var once sync.Once
	return merged, func() {
		once.Do(func() { _ = unix.Unmount(merged, unix.MNT_DETACH) })
	}, nil
}

// runStepInRootfs runs a RUN step with runc in its own namespaces (the build
// network's, or the host's for trusted local builds) and cgroup.
func runStepInRootfs(ctx context.Context, spec BuildSpec, step Step, st *buildState, merged string, root *os.Root, work string, net *buildNet, buildID string, progress io.Writer) error {
	runc, err := exec.LookPath("runc")
	if err != nil {
		return fmt.Errorf("runc is not installed: %w", errdefs.ErrUnavailable)
	}
	userSpec := step.User
	if userSpec == "" {
		userSpec = st.User
	}
	u := userInfo{home: "/root"}
	if userSpec != "" {
		if u, err = lookupUser(root, userSpec); err != nil {
			return err
		}
	}
	cwd := st.Workdir
	if cwd == "" {
		cwd = "/"
	}
	_ = root.MkdirAll(strings.TrimPrefix(cwd, "/"), 0o755)
	env := []string{"PATH=" + defaultPath, "HOME=" + u.home}
	for _, kv := range st.Env {
		k, _, _ := strings.Cut(kv, "=")
		env = slices.DeleteFunc(env, func(e string) bool { return strings.HasPrefix(e, k+"=") })
		env = append(env, kv)
	}
	args := shellOrExec(step)

	bundle := filepath.Join(work, "bundle")
	if err := os.MkdirAll(bundle, 0o700); err != nil {
		return err
	}
	resolv := "/etc/resolv.conf"
	if net.netns != "" {
		resolv = filepath.Join(bundle, "resolv.conf")
		var b strings.Builder
		for _, d := range net.dns {
			fmt.Fprintf(&b, "nameserver %s\n", d)
		}
		if err := os.WriteFile(resolv, []byte(b.String()), 0o644); err != nil {
			return err
		}
	}
	memMB := spec.BuildMemoryMB
	if memMB == 0 {
		memMB = 4096
	}
	id := buildID + "-" + randomSuffix()
	cfg := buildSpecJSON(merged, args, env, cwd, u, net.netns, resolv, id, memMB)
	b, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o600); err != nil {
		return err
	}
	runcRoot := "/run/agentbox-build/runc"
	if err := os.MkdirAll(runcRoot, 0o700); err != nil {
		return err
	}
	defer func() {
		_ = exec.Command(runc, "--root", runcRoot, "delete", "--force", id).Run()
	}()
	cmd := exec.CommandContext(ctx, runc, "--root", runcRoot, "run", "--bundle", bundle, id)
	cmd.Stdin = nil
	tail := &tailWriter{out: progress, max: 10}
	cmd.Stdout, cmd.Stderr = tail, tail
	err = cmd.Run()
	tail.flush()
	if err != nil {
		code := -1
		if ee, ok := errors.AsType[*exec.ExitError](err); ok {
			code = ee.ExitCode()
		}
		return &BuildError{ExitCode: code, Output: strings.Join(tail.lines, "\n"), Err: err}
	}
	return nil
}

// buildSpecJSON is the runc config of one RUN step: the sandbox profile
// (Docker's default capabilities, masked /proc paths, device allowlist)
// with the step's process.
func buildSpecJSON(rootfs string, args, env []string, cwd string, u userInfo, netns, resolv, id string, memMB int) *specs.Spec {
	caps := []string{
		"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
		"CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
		"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
	}
	var devices []specs.LinuxDevice
	rules := []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}}
	mode := os.FileMode(0o666)
	zero := uint32(0)
	for _, d := range []struct {
		path         string
		major, minor int64
	}{{"/dev/null", 1, 3}, {"/dev/zero", 1, 5}, {"/dev/full", 1, 7}, {"/dev/random", 1, 8}, {"/dev/urandom", 1, 9}, {"/dev/tty", 5, 0}} {
		devices = append(devices, specs.LinuxDevice{Path: d.path, Type: "c", Major: d.major, Minor: d.minor, FileMode: &mode, UID: &zero, GID: &zero})
		rules = append(rules, specs.LinuxDeviceCgroup{Allow: true, Type: "c", Major: &d.major, Minor: &d.minor, Access: "rwm"})
	}
	ptmx, pts := int64(5), int64(136)
	two := int64(2)
	rules = append(rules, specs.LinuxDeviceCgroup{Allow: true, Type: "c", Major: &ptmx, Minor: &two, Access: "rwm"},
		specs.LinuxDeviceCgroup{Allow: true, Type: "c", Major: &pts, Access: "rwm"})
	limit := int64(memMB) << 20
	pids := int64(4096)
	ns := []specs.LinuxNamespace{{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace}, {Type: specs.MountNamespace}}
	if netns != "" {
		ns = append(ns, specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: netns})
	}
	return &specs.Spec{
		Version:  "1.0.2",
		Hostname: "build",
		Root:     &specs.Root{Path: rootfs},
		Process: &specs.Process{
			Args: args, Env: env, Cwd: cwd,
			User:         specs.User{UID: u.uid, GID: u.gid, AdditionalGids: u.groups},
			Capabilities: &specs.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps},
		},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=256m"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			{Destination: "/etc/resolv.conf", Type: "bind", Source: resolv, Options: []string{"bind", "ro", "nosuid", "nodev"}},
		},
		Linux: &specs.Linux{
			Namespaces:  ns,
			Devices:     devices,
			CgroupsPath: "agentbox-build/" + id,
			Resources: &specs.LinuxResources{
				Devices: rules,
				Memory:  &specs.LinuxMemory{Limit: &limit, Swap: &limit},
				Pids:    &specs.LinuxPids{Limit: &pids},
			},
			MaskedPaths: []string{"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
				"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi"},
			ReadonlyPaths: []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
		},
	}
}

// tailWriter streams lines to out, indented, and keeps the last max lines.
type tailWriter struct {
	mu    sync.Mutex
	out   io.Writer
	buf   []byte
	lines []string
	max   int
}

func (t *tailWriter) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	for {
		i := bytes.IndexByte(t.buf, '\n')
		if i < 0 {
			break
		}
		t.line(string(t.buf[:i]))
		t.buf = t.buf[i+1:]
	}
	return len(p), nil
}

func (t *tailWriter) line(l string) {
	l = strings.TrimRight(l, "\r")
	fmt.Fprintf(t.out, "    %s\n", l)
	t.lines = append(t.lines, l)
	if len(t.lines) > t.max {
		t.lines = t.lines[1:]
	}
}

func (t *tailWriter) flush() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.buf) > 0 {
		t.line(string(t.buf))
		t.buf = nil
	}
}

type userInfo struct {
	uid, gid uint32
	groups   []uint32
	home     string
}

// lookupUser resolves "user[:group]" (names or numbers) with the image's
// own /etc/passwd and /etc/group.
func lookupUser(root *os.Root, spec string) (userInfo, error) {
	name, group, _ := strings.Cut(spec, ":")
	u := userInfo{home: "/"}
	if n, err := strconv.ParseUint(name, 10, 32); err == nil {
		u.uid = uint32(n)
		u.home = "/root"
		if n != 0 {
			u.home = "/"
		}
	} else {
		found := false
		for _, f := range readColonFile(root, "etc/passwd") {
			if len(f) >= 6 && f[0] == name {
				uid, _ := strconv.ParseUint(f[2], 10, 32)
				gid, _ := strconv.ParseUint(f[3], 10, 32)
				u.uid, u.gid, u.home, found = uint32(uid), uint32(gid), f[5], true
				break
			}
		}
		if !found {
			return u, fmt.Errorf("user %q does not exist in the image", name)
		}
	}
	if group != "" {
		if n, err := strconv.ParseUint(group, 10, 32); err == nil {
			u.gid = uint32(n)
		} else {
			found := false
			for _, f := range readColonFile(root, "etc/group") {
				if len(f) >= 3 && f[0] == group {
					gid, _ := strconv.ParseUint(f[2], 10, 32)
					u.gid, found = uint32(gid), true
				}
			}
			if !found {
				return u, fmt.Errorf("group %q does not exist in the image", group)
			}
		}
	}
	if name != "" {
		for _, f := range readColonFile(root, "etc/group") {
			if len(f) >= 4 && slices.Contains(strings.Split(f[3], ","), name) {
				if gid, err := strconv.ParseUint(f[2], 10, 32); err == nil && uint32(gid) != u.gid {
					u.groups = append(u.groups, uint32(gid))
				}
			}
		}
	}
	return u, nil
}

func readColonFile(root *os.Root, name string) [][]string {
	f, err := root.Open(name)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out [][]string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if line := sc.Text(); line != "" && !strings.HasPrefix(line, "#") {
			out = append(out, strings.Split(line, ":"))
		}
	}
	return out
}

// walkSources calls fn for every file, dir and symlink a COPY step's
// sources name inside its context, in a stable order, skipping what the
// .dockerignore patterns exclude. rel is the context-relative path, dst the
// path relative to the destination.
func walkSources(step Step, fn func(ctxRoot *os.Root, rel, dst string, d fs.DirEntry, single bool) error) error {
	if step.ContextDir == "" {
		return fmt.Errorf("COPY needs a build context")
	}
	ctxRoot, err := os.OpenRoot(step.ContextDir)
	if err != nil {
		return fmt.Errorf("build context: %w", err)
	}
	defer ctxRoot.Close()
	fsys := ctxRoot.FS()
	ignored := func(rel string) bool {
		if step.Ignore == nil || rel == "." {
			return false
		}
		m, _ := step.Ignore.MatchesOrParentMatches(rel)
		return m
	}
	var matches []string
	for _, src := range step.Src {
		clean := path.Clean(strings.TrimPrefix(src, "/"))
		if !fs.ValidPath(clean) {
			return fmt.Errorf("COPY source %q is outside the build context", src)
		}
		if strings.ContainsAny(clean, "*?[") {
			m, err := fs.Glob(fsys, clean)
			if err != nil {
				return fmt.Errorf("COPY source %q: %w", src, err)
			}
			matches = append(matches, m...)
		} else {
			matches = append(matches, clean)
		}
	}
	matches = slices.DeleteFunc(matches, ignored)
	if len(matches) == 0 {
		return fmt.Errorf("COPY %s: no such file in the build context", strings.Join(step.Src, " "))
	}
	single := len(matches) == 1
	for _, m := range matches {
		fi, err := ctxRoot.Lstat(m)
		if err != nil {
			return fmt.Errorf("COPY %s: %w", m, err)
		}
		if !fi.IsDir() {
			if err := fn(ctxRoot, m, path.Base(m), fs.FileInfoToDirEntry(fi), single); err != nil {
				return err
			}
			continue
		}
		// A directory source copies its contents.
		err = fs.WalkDir(fsys, m, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if p != m && ignored(p) {
				if d.IsDir() {
					return fs.SkipDir
				}
				return nil
			}
			rel := strings.TrimPrefix(strings.TrimPrefix(p, m), "/")
			if rel == "" {
				rel = "."
			}
			return fn(ctxRoot, p, rel, d, false)
		})
		if err != nil {
			return fmt.Errorf("COPY %s: %w", m, err)
		}
	}
	return nil
}

// hashSources is the content key of a COPY from a context dir: paths,
// modes, sizes, file contents and link targets (not owners or times).
func hashSources(step Step) (string, error) {
	h := sha256.New()
	err := walkSources(step, func(ctxRoot *os.Root, rel, dst string, d fs.DirEntry, _ bool) error {
		fi, err := d.Info()
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s\x00%s\x00%o\x00%d\x00", rel, dst, fi.Mode(), fi.Size())
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			t, err := ctxRoot.Readlink(rel)
			if err != nil {
				return err
			}
			h.Write([]byte(t))
		case fi.Mode().IsRegular():
			f, err := ctxRoot.Open(rel)
			if err != nil {
				return err
			}
			defer f.Close()
			if _, err := io.Copy(h, f); err != nil {
				return err
			}
		}
		return nil
	})
	return hex.EncodeToString(h.Sum(nil)), err
}

// copySources copies a COPY step's sources into the merged rootfs (an
// os.Root, so the destination cannot leave it either) and returns the
// number of entries copied. Owners are uid/gid; mode, when set, replaces
// the files' permissions.
func copySources(step Step, root *os.Root, dest string, uid, gid int, mode fs.FileMode) (int, error) {
	destRel := strings.TrimPrefix(path.Clean(dest), "/")
	if destRel == "" {
		destRel = "."
	}
	intoDir := strings.HasSuffix(dest, "/") || len(step.Src) > 1
	n := 0
	err := walkSources(step, func(ctxRoot *os.Root, rel, dst string, d fs.DirEntry, single bool) error {
		fi, err := d.Info()
		if err != nil {
			return err
		}
		var target string
		switch {
		case dst == ".":
			target = destRel
		case !fi.IsDir() && single && !intoDir && !isDir(root, destRel):
			target = destRel // COPY file /path/newname
		default:
			target = path.Join(destRel, dst)
		}
		if parent := path.Dir(target); parent != "." {
			if err := root.MkdirAll(parent, 0o755); err != nil {
				return fmt.Errorf("create %s: %w", parent, err)
			}
		}
		perm := fi.Mode().Perm()
		if mode != 0 && !fi.IsDir() {
			perm = mode
		}
		switch {
		case fi.IsDir():
			if err := root.Mkdir(target, perm); err != nil && !errors.Is(err, fs.ErrExist) {
				return err
			}
		case fi.Mode()&fs.ModeSymlink != 0:
			t, err := ctxRoot.Readlink(rel)
			if err != nil {
				return err
			}
			_ = root.Remove(target)
			if err := root.Symlink(t, target); err != nil {
				return err
			}
		case fi.Mode().IsRegular():
			if err := copyFileInRoot(ctxRoot, rel, root, target, perm); err != nil {
				return err
			}
		default:
			return nil // sockets, devices: not copied
		}
		n++
		if err := root.Lchown(target, uid, gid); err != nil {
			return err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			return root.Chmod(target, perm)
		}
		return nil
	})
	return n, err
}

func isDir(root *os.Root, rel string) bool {
	fi, err := root.Stat(rel)
	return err == nil && fi.IsDir()
}

func copyFileInRoot(from *os.Root, src string, to *os.Root, dst string, perm fs.FileMode) error {
	in, err := from.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if fi, err := to.Lstat(dst); err == nil && !fi.Mode().IsRegular() {
		if err := to.RemoveAll(dst); err != nil {
			return err
		}
	}
	out, err := to.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, perm)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

// Uploaded COPY contexts (E2B API): <dir>/.uploads/<sha256>.tar.gz.
const uploadsDir = ".uploads"

func validFilesHash(h string) bool { return validLayerID(h) }

func (s *Store) uploadPath(hash string) string {
	return filepath.Join(s.dir, uploadsDir, hash+".tar.gz")
}

// HasUpload reports whether the files with this hash were uploaded.
func (s *Store) HasUpload(hash string) bool {
	if !validFilesHash(hash) {
		return false
	}
	_, err := os.Stat(s.uploadPath(hash))
	return err == nil
}

// PutUpload stores an uploaded (gzipped or plain) tar of COPY sources under
// the hash the client computed for them, at most maxBytes long.
func (s *Store) PutUpload(hash string, r io.Reader, maxBytes int64) error {
	if !validFilesHash(hash) {
		return fmt.Errorf("files hash %q: want 64 hex digits: %w", hash, errdefs.ErrInvalidArgument)
	}
	dir := filepath.Join(s.dir, uploadsDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".part-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	n, err := io.Copy(f, io.LimitReader(r, maxBytes+1))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("upload %s: %w", hash[:12], err)
	}
	if n > maxBytes {
		return fmt.Errorf("upload %s: more than %d bytes: %w", hash[:12], maxBytes, errdefs.ErrTooLarge)
	}
	return os.Rename(f.Name(), s.uploadPath(hash))
}

// extractUpload unpacks upload hash into dir with the layer unpacker (so
// its paths cannot escape either).
func (s *Store) extractUpload(ctx context.Context, hash, dir string) error {
	if !s.HasUpload(hash) {
		return fmt.Errorf("files %s were not uploaded: %w", hash, errdefs.ErrNotFound)
	}
	f, err := os.Open(s.uploadPath(hash))
	if err != nil {
		return err
	}
	defer f.Close()
	br := bufio.NewReader(f)
	var r io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return fmt.Errorf("upload %s: %w", hash[:12], err)
		}
		defer zr.Close()
		r = zr
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if _, err := unpackLayer(ctx, r, dir); err != nil {
		return fmt.Errorf("upload %s: %w", hash[:12], err)
	}
	return nil
}
