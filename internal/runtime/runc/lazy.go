package runc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agentbox/agentbox/internal/runtime"
)

// Lazy resume: a paused sandbox whose memory image is large comes back with
// its anonymous memory missing. CRIU's lazy-pages daemon holds the
// userfaultfd of every restored task, fills each page from the image when
// it is first touched and copies the rest in the background; it exits once
// every page is in. The sandbox serves while that happens.
//
// The daemon lives exactly as long as the pages it owes: a restore that
// fails kills it, and it is never tied to the server's life (a daemon that
// dies early leaves the sandbox reading zeros where its memory was), so a
// server killed mid-resume leaves either a running sandbox whose daemon
// finishes on its own or a daemon that the next start kills (settleLazy)
// with the sandbox still paused. The image stays until the daemon is gone.

const (
	// lazyPidFile records the running daemon of a sandbox: "pid starttime".
	lazyPidFile = "lazy-pages.pid"
	// lazyLog is the daemon's CRIU log, in the bundle.
	lazyLog = "criu-lazy-pages.log"
	// DefaultLazyResumeMB is Config.LazyResumeMB's default.
	DefaultLazyResumeMB = 256
	// lazyReadyTimeout bounds the wait for the daemon's socket.
	lazyReadyTimeout = 10 * time.Second
)

// lazyState is the driver's bookkeeping of lazy resumes.
type lazyState struct {
	probe sync.Once
	// off says why lazy restores are unavailable here ("" = available).
	mu  sync.Mutex
	off string
	// drops are pause images whose removal waits for their daemon,
	// closed once removed.
	drops map[string]chan struct{}
	// watched are sandboxes whose daemon this process started and
	// watches: true once it was killed on purpose.
	watched map[string]bool
}

// lazyWanted says whether the pause image img is restored lazily, and if
// not while its size would call for it, why not.
func (d *Driver) lazyWanted(img string, mode runtime.Lazy) (bool, string) {
	switch mode {
	case runtime.LazyNever:
		return false, ""
	case runtime.LazyAuto:
		if d.cfg.LazyResumeMB < 0 || pagesSize(img) < int64(d.cfg.LazyResumeMB)<<20 {
			return false, ""
		}
	}
	d.lazy.probe.Do(func() {
		criu, err := d.criu()
		if err != nil {
			d.setLazyOff(err.Error())
			return
		}
		if out, err := exec.Command(criu, "check", "--feature", "uffd-noncoop").CombinedOutput(); err != nil {
			d.setLazyOff("the kernel's userfaultfd lacks non-cooperative events: " + strings.TrimSpace(string(out)))
			return
		}
		if d.b.UserNS() {
			// Tasks restored into a user namespace cannot call
			// userfaultfd(2) unless vm.unprivileged_userfaultfd is set;
			// our CRIU opens the device instead.
			if _, err := os.Stat("/dev/userfaultfd"); err != nil {
				d.setLazyOff("no /dev/userfaultfd (kernel < 6.1 or CONFIG_USERFAULTFD off), which tasks restored into a user namespace need")
			}
		}
	})
	d.lazy.mu.Lock()
	defer d.lazy.mu.Unlock()
	return d.lazy.off == "", d.lazy.off
}

func (d *Driver) setLazyOff(why string) {
	d.lazy.mu.Lock()
	defer d.lazy.mu.Unlock()
	d.lazy.off = why
}

// pagesSize is the size of the memory pages of the CRIU image in img.
func pagesSize(img string) int64 {
	files, _ := filepath.Glob(filepath.Join(img, "pages-*.img"))
	var n int64
	for _, f := range files {
		if fi, err := os.Stat(f); err == nil {
			n += fi.Size()
		}
	}
	return n
}

// lazyDaemon is a running lazy-pages daemon started by this process.
type lazyDaemon struct {
	cmd   *exec.Cmd
	dir   string // the sandbox's bundle, which holds its record
	start time.Time
	done  chan struct{} // closed once reaped
	err   error         // its exit, valid after done
}

// startLazyPages starts CRIU's lazy-pages daemon serving img. Its socket is
// made in work, the restore's private (0700) work dir, where the restore
// looks for it. It returns once the daemon listens.
func (d *Driver) startLazyPages(ctx context.Context, id, dir, img, work string) (*lazyDaemon, error) {
	criu, err := d.criu()
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	cmd := exec.Command(criu, "lazy-pages", "-D", img, "-W", work, "-o", filepath.Join(dir, lazyLog), "--status-fd", "3")
	cmd.ExtraFiles = []*os.File{w}
	// Its own session: the server's death must not take the pages the
	// sandbox still needs (see above).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	w.Close()
	if err != nil {
		return nil, fmt.Errorf("criu lazy-pages: %w", err)
	}
	ld := &lazyDaemon{cmd: cmd, dir: dir, start: time.Now(), done: make(chan struct{})}
	go func() {
		ld.err = cmd.Wait()
		close(ld.done)
	}()
	if err := writeLazyPid(dir, cmd.Process.Pid); err != nil {
		ld.kill()
		return nil, fmt.Errorf("sandbox %s: %w", id, err)
	}
	ready := make(chan error, 1)
	go func() {
		var b [1]byte
		_, err := r.Read(b[:]) // status_ready writes one byte; EOF if it died
		ready <- err
	}()
	timer := time.NewTimer(lazyReadyTimeout)
	defer timer.Stop()
	select {
	case err = <-ready:
	case <-timer.C:
		err = errors.New("not ready in time")
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		ld.kill()
		return nil, fmt.Errorf("criu lazy-pages: %w%s", err, logHint(filepath.Join(dir, lazyLog)))
	}
	return ld, nil
}

// kill ends a daemon whose restore failed, reaps it and removes its
// record.
func (ld *lazyDaemon) kill() {
	_ = ld.cmd.Process.Kill()
	<-ld.done
	_ = os.Remove(filepath.Join(ld.dir, lazyPidFile))
}

// watch follows a daemon serving sandbox id after a successful restore:
// it logs when all memory is in, and kills the sandbox when the daemon
// failed, because the pages it did not deliver read as zeros.
func (d *Driver) watch(id, dir string, ld *lazyDaemon) {
	<-ld.done
	_ = os.Remove(filepath.Join(dir, lazyPidFile))
	d.lazy.mu.Lock()
	killed := d.lazy.watched[id]
	delete(d.lazy.watched, id)
	d.lazy.mu.Unlock()
	if killed {
		return // the sandbox is going (killLazy)
	}
	if ld.err != nil {
		d.log.Error("lazy resume: the page daemon failed before all memory was in; killing the sandbox, whose memory is incomplete",
			"id", id, "err", ld.err, "log", logHint(filepath.Join(dir, lazyLog)))
		_ = d.KillInit(context.Background(), id)
		return
	}
	d.log.Info("lazy resume: all memory loaded", "id", id, "took", time.Since(ld.start).Round(time.Millisecond))
}

// startWatch records that this process watches the daemon of id and
// starts watch.
func (d *Driver) startWatch(id, dir string, ld *lazyDaemon) {
	d.lazy.mu.Lock()
	if d.lazy.watched == nil {
		d.lazy.watched = map[string]bool{}
	}
	d.lazy.watched[id] = false
	d.lazy.mu.Unlock()
	go d.watch(id, dir, ld)
}

// logHint is the first error line of a CRIU log, for error messages: the
// first error is the cause; later ones are the unwinding (the rlimit one
// is a known, harmless warning of this build).
func logHint(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	for l := range bytes.SplitSeq(b, []byte("\n")) {
		if bytes.Contains(l, []byte("Error")) && !bytes.Contains(l, []byte("RLIMIT_NOFILE")) {
			return " (criu: " + strings.TrimSpace(string(l)) + ")"
		}
	}
	return ""
}

func writeLazyPid(dir string, pid int) error {
	st, err := procStart(pid)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, lazyPidFile), []byte(strconv.Itoa(pid)+" "+st+"\n"), 0o600)
}

// procStart is process pid's start time (field 22 of /proc/pid/stat),
// which tells it from a later process with the same pid.
func procStart(pid int) (string, error) {
	f, err := procStat(pid)
	if err != nil {
		return "", err
	}
	return f[19], nil
}

// procStat reads /proc/pid/stat and returns its fields after the command
// name (which is in parentheses and may hold spaces): the state is the
// first, the start time the twentieth.
func procStat(pid int) ([]string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return nil, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	return f, nil
}

// lazyPid is the pid of the sandbox's page daemon if it still runs.
func lazyPid(dir string) (int, bool) {
	pid, _, ok := lazyProc(dir)
	return pid, ok
}

// lazyProc is the pid and start time of the sandbox's page daemon if it
// still runs.
func lazyProc(dir string) (pid int, start string, ok bool) {
	b, err := os.ReadFile(filepath.Join(dir, lazyPidFile))
	if err != nil {
		return 0, "", false
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, "", false
	}
	pid, err = strconv.Atoi(f[0])
	if err != nil || pid <= 0 {
		return 0, "", false
	}
	if st, err := procStart(pid); err != nil || st != f[1] {
		return 0, "", false
	}
	return pid, f[1], true
}

// waitLazyGone waits until the sandbox's page daemon (if any) has exited.
func waitLazyGone(ctx context.Context, dir string) error {
	for {
		if _, ok := lazyPid(dir); !ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// killLazy kills the page daemon of sandbox id, if any, and waits for it.
func (d *Driver) killLazy(ctx context.Context, id string) error {
	d.lazy.mu.Lock()
	if _, ok := d.lazy.watched[id]; ok {
		d.lazy.watched[id] = true
	}
	d.lazy.mu.Unlock()
	return killLazyDir(ctx, d.b.Dir(id))
}

// killLazyDir kills the page daemon recorded in bundle dir, if any, and
// waits for it.
func killLazyDir(ctx context.Context, dir string) error {
	pid, st, ok := lazyProc(dir)
	_ = os.Remove(filepath.Join(dir, lazyPidFile))
	if !ok {
		return nil
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	for deadline := time.Now().Add(10 * time.Second); ; {
		if now, err := procStart(pid); err != nil || now != st {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("lazy-pages daemon %d did not exit after SIGKILL", pid)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// settleLazy finishes the bookkeeping of a lazy resume a restarted server
// finds. A `runc restore` the dead server started may still run: it is
// waited for, since killing its daemon would fail it half way. Then a
// daemon whose sandbox runs finishes on its own, and one whose sandbox does
// not serves nobody and is killed, leaving the sandbox paused.
func (d *Driver) settleLazy(ctx context.Context, id string) {
	dir := d.b.Dir(id)
	// The restore's work dir (CRIU's log, the daemon's socket) is removed
	// by the restore that made it, which a killed server never finished.
	work := filepath.Join(dir, restoreWorkDir)
	if _, ok := lazyPid(dir); !ok {
		_ = os.Remove(filepath.Join(dir, lazyPidFile))
		if _, err := os.Stat(work); err == nil && !restoreInFlight(dir) {
			_ = os.RemoveAll(work)
		}
		return
	}
	for deadline := time.Now().Add(2 * time.Minute); restoreInFlight(dir) && time.Now().Before(deadline); {
		select {
		case <-ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
	// The daemon, if it still serves, is connected already.
	_ = os.RemoveAll(work)
	if d.IsRunning(ctx, id) {
		return // it serves the running sandbox and ends on its own
	}
	if err := killLazyDir(ctx, dir); err != nil {
		d.log.Warn("lazy resume: stale page daemon", "id", id, "err", err)
	}
}

// restoreInFlight reports whether a `runc restore` of the bundle in dir
// runs (one an earlier server process started).
func restoreInFlight(dir string) bool {
	cmds, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range cmds {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		restore, bundle := false, false
		for i, a := range args {
			restore = restore || a == "restore"
			bundle = bundle || a == "--bundle" && i+1 < len(args) && args[i+1] == dir
		}
		if restore && bundle {
			return true
		}
	}
	return false
}

// dropAfterLazy removes the pause image of id once its page daemon is gone,
// in the background when the daemon still runs. It reports whether it
// took over the removal.
func (d *Driver) dropAfterLazy(id string) bool {
	dir := d.b.Dir(id)
	if _, ok := lazyPid(dir); !ok {
		// A record left by a server that died while its daemon ran.
		_ = os.Remove(filepath.Join(dir, lazyPidFile))
		return false
	}
	d.lazy.mu.Lock()
	defer d.lazy.mu.Unlock()
	if _, ok := d.lazy.drops[id]; ok {
		return true
	}
	if d.lazy.drops == nil {
		d.lazy.drops = map[string]chan struct{}{}
	}
	ch := make(chan struct{})
	d.lazy.drops[id] = ch
	go func() {
		defer func() {
			d.lazy.mu.Lock()
			delete(d.lazy.drops, id)
			d.lazy.mu.Unlock()
			close(ch)
		}()
		_ = waitLazyGone(context.Background(), dir)
		_ = os.Remove(filepath.Join(dir, lazyPidFile))
		if err := d.b.DropImage(id); err != nil {
			d.log.Warn("lazy resume: remove pause image", "id", id, "err", err)
		}
	}()
	return true
}

// waitLazy waits until no page daemon serves sandbox id and a removal of
// its old image is done, so a new checkpoint neither races the daemon nor
// is removed in its place.
func (d *Driver) waitLazy(ctx context.Context, id string) error {
	d.lazy.mu.Lock()
	ch := d.lazy.drops[id]
	d.lazy.mu.Unlock()
	if ch != nil {
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return waitLazyGone(ctx, d.b.Dir(id))
}
