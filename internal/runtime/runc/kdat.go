package runc

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// CRIU probes the kernel's features at the start of every run: tens of
// milliseconds, two `iptables -L` process starts among them, paid by each
// dump, each restore (twice: runc's feature check is a CRIU run too) and
// each copy of a fork. It skips the probe when it finds its cache,
// criuKdatFile, but writes that cache only when /run is a tmpfs, so that a
// reboot forgets it. On a host whose /run is a plain directory CRIU never
// caches, and reads a cache that is there. The driver has CRIU write it
// once on a tmpfs of a private mount namespace and puts the result at
// criuKdatFile, once per server process (a server starts after the boot it
// runs in, so the cache is never an earlier boot's) and again whenever
// CRIU removed it (it does so when the cache is not its own build's).
const (
	// criuKdatFile is CRIU's cache path, fixed when CRIU is built
	// (KDAT_RUNDIR "/criu.kdat").
	criuKdatFile = "/run/criu.kdat"
	// criuKdatMagic is the cache's first word (KDAT_MAGIC in CRIU's
	// magic.h); the second is CRIU's build time, checked by CRIU itself.
	criuKdatMagic = 0x57023458
	// kdatProbeTimeout bounds the one `criu check` that writes the cache.
	kdatProbeTimeout = 30 * time.Second
)

// kdatCache keeps CRIU's kernel-feature cache in place.
type kdatCache struct {
	mu sync.Mutex
	// file is the cache's path; empty means criuKdatFile.
	file string
	// probe has CRIU write its cache on a tmpfs at filepath.Dir(file)
	// and returns it; nil means probeKdat.
	probe func(ctx context.Context, criu, runDir string) ([]byte, error)
	// placed: this process put the cache in place. done: nothing more to
	// do (CRIU caches by itself here, or priming is impossible).
	placed, done bool
}

// ensure puts CRIU's cache in place if it is not. It never fails a pause
// or a restore: without the cache CRIU probes, as it always did.
func (k *kdatCache) ensure(ctx context.Context, criu string, log *slog.Logger) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.done {
		return
	}
	file := k.file
	if file == "" {
		file = criuKdatFile
	}
	if k.placed {
		if _, err := os.Stat(file); err == nil {
			return
		}
	}
	runDir := filepath.Dir(file)
	var st unix.Statfs_t
	if err := unix.Statfs(runDir, &st); err != nil {
		k.done = true
		log.Info("CRIU probes the kernel at every run: its cache dir cannot be read", "dir", runDir, "err", err)
		return
	}
	if st.Type == unix.TMPFS_MAGIC {
		k.done = true // CRIU keeps its own cache there
		return
	}
	probe := k.probe
	if probe == nil {
		probe = probeKdat
	}
	// Once per server: bounded, so a hung CRIU never holds pauses.
	ctx, cancel := context.WithTimeout(ctx, kdatProbeTimeout)
	defer cancel()
	b, err := probe(ctx, criu, runDir)
	if err == nil {
		err = checkKdat(b)
	}
	if err == nil {
		err = placeKdat(file, b)
	}
	if err != nil {
		k.done = true
		log.Warn("CRIU probes the kernel at every run: its kernel-feature cache could not be made", "file", file, "err", err)
		return
	}
	k.placed = true
	log.Info("CRIU kernel-feature cache in place (this host's /run is not a tmpfs, where CRIU would keep it itself)", "file", file, "bytes", len(b))
}

// checkKdat reports whether b looks like a CRIU kernel-feature cache.
func checkKdat(b []byte) error {
	if len(b) < 8 || binary.NativeEndian.Uint32(b) != criuKdatMagic {
		return fmt.Errorf("CRIU wrote no kernel-feature cache (%d bytes)", len(b))
	}
	return nil
}

// placeKdat writes cache b at file, whole or not at all: CRIU reads it
// without a lock, and other servers of the host may place theirs at the
// same time (of the same binary on the same kernel, so equal).
func placeKdat(file string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(file), ".agentbox-criu.kdat-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, werr := f.Write(b)
	if err := errors.Join(werr, f.Chmod(0o600), f.Close()); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, file); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return nil
}

// probeKdat runs `criu check` in a mount namespace of its own where runDir
// is an empty tmpfs, so CRIU saves its cache there, and returns the cache.
// The namespace is made on a locked OS thread that is never unlocked and is
// never the process's main thread: the thread ends with its goroutine and
// nothing else ever runs in it.
func probeKdat(ctx context.Context, criu, runDir string) ([]byte, error) {
	type result struct {
		b   []byte
		err error
	}
	done := make(chan result, 1)
	// work runs on a thread locked to it, which ends with it.
	work := func() result {
		b, err := func() ([]byte, error) {
			if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
				return nil, fmt.Errorf("unshare mount namespace: %w", err)
			}
			if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
				return nil, fmt.Errorf("private mounts: %w", err)
			}
			if err := unix.Mount("tmpfs", runDir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0700,size=1m"); err != nil {
				return nil, fmt.Errorf("mount tmpfs on %s: %w", runDir, err)
			}
			// The child is forked from this thread, so it runs in its
			// mount namespace. `criu check` may report missing features
			// and fail: the cache is written before, and is all we want.
			cmd := exec.CommandContext(ctx, criu, "check")
			cmd.Dir = runDir
			out, cerr := cmd.CombinedOutput()
			b, err := os.ReadFile(filepath.Join(runDir, filepath.Base(criuKdatFile)))
			if err != nil {
				return nil, fmt.Errorf("criu check wrote no cache: %w (criu: %v: %s)", err, cerr, lastLine(out))
			}
			return b, nil
		}()
		return result{b, err}
	}
	go func() {
		goruntime.LockOSThread()
		if unix.Gettid() != unix.Getpid() {
			done <- work()
			return
		}
		// The process's main thread: a goroutine that ends locked to it
		// does not end it but wedges it, and /proc/self (the server's
		// mountinfo, its mount namespace) is that thread's view. Hold it
		// while another thread does the work: no goroutine can take a
		// thread locked to this one.
		inner := make(chan result, 1)
		go func() {
			goruntime.LockOSThread()
			inner <- work()
		}()
		r := <-inner
		goruntime.UnlockOSThread()
		done <- r
	}()
	select {
	case r := <-done:
		return r.b, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// lastLine is the last line of out.
func lastLine(out []byte) string {
	s := strings.TrimSpace(string(out))
	return s[strings.LastIndexByte(s, '\n')+1:]
}
