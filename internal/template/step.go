package template

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime"
)

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// runStep runs a RUN step as a sandbox through spec.Runner: the step's
// layers below, upper (the new layer) receiving its writable layer.
func (s *Store) runStep(ctx context.Context, spec BuildSpec, step Step, st *buildState, upper string, progress io.Writer) error {
	lowers, err := s.layerPaths(st.LayerIDs)
	if err != nil {
		return err
	}
	user := step.User
	if user == "" {
		user = st.User
	}
	if user == "" {
		user = "root"
	}
	env := map[string]string{"PATH": defaultPath}
	for _, kv := range st.Env {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	cmd := strings.Join(step.Args, " ")
	if step.Exec {
		cmd = commandString(step.Args)
	}
	wd := st.Workdir
	if wd == "" {
		wd = "/"
	}
	// The runner makes UpperDir itself (it must not exist).
	if err := os.Remove(upper); err != nil {
		return err
	}
	tail := &tailWriter{out: progress, max: 10}
	err = spec.Runner.RunSteps(ctx, StepRequest{
		TeamID: spec.TeamID, BuildID: spec.BuildID, Layers: lowers,
		Commands: []StepCommand{{Line: step.Line, Cmd: cmd, User: user, Workdir: wd, Env: env}},
		UpperDir: upper, Output: tail,
		// The template's own sizes when the build names them; the runner
		// holds them to the team's quota.
		CPUCount: spec.CPUCount, MemoryMB: cmp.Or(spec.BuildMemoryMB, spec.MemoryMB), DiskMB: spec.BuildDiskMB,
	})
	tail.flush()
	if err != nil {
		code := -1
		var ec interface{ ExitCode() int }
		if errors.As(err, &ec) {
			code = ec.ExitCode()
		}
		return &BuildError{ExitCode: code, Output: strings.Join(tail.lines, "\n"), Err: err}
	}
	if _, err := os.Lstat(upper); errors.Is(err, fs.ErrNotExist) {
		return os.Mkdir(upper, 0o755) // the step changed nothing
	} else if err != nil {
		return err
	}
	return nil
}

func (s *Store) layerPaths(ids []string) ([]string, error) {
	out := make([]string, 0, len(ids))
	for _, ref := range ids {
		p, err := s.layerRefPath(ref)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// writeStep writes a COPY or WORKDIR step's layer on the host: the layers
// below and upper are mounted as an overlay in a work dir of the layer, and
// every write goes through an os.Root of the merged tree, so neither the
// context's nor the image's symlinks lead out of it.
func (s *Store) writeStep(step Step, st *buildState, upper string, progress io.Writer) error {
	work := filepath.Dir(upper)
	lowers, err := s.layerPaths(st.LayerIDs)
	if err != nil {
		return err
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
	// Layers named by descriptor: RUN steps see no host path in mountinfo.
	opts, done, err := runtime.OverlayOptions(top, upper, ovlWork)
	if err != nil {
		return "", nil, fmt.Errorf("mount overlay: %w", err)
	}
	defer done()
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
