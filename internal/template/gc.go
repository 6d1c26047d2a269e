package template

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Garbage collection and builds in flight, without a store-wide lock:
//   - a build holds a lease (<dir>/.build-<id>/lease, flocked for the build's
//     life, also across processes) naming every layer it stands on or made,
//     so GC keeps them although no template names them yet;
//   - layer commits and lease updates hold <dir>/.gc.lock shared, GC holds it
//     exclusive: builds never wait for each other, only for a running GC.
const (
	gcLockFile = ".gc.lock"
	leaseFile  = "lease"
)

// gcLock takes the GC lock, shared (builds) or exclusive (GC), waiting until
// ctx ends.
func (s *Store) gcLock(ctx context.Context, exclusive bool) (func(), error) {
	how := unix.LOCK_SH
	if exclusive {
		how = unix.LOCK_EX
	}
	return flockFile(ctx, filepath.Join(s.dir, gcLockFile), how)
}

func flockFile(ctx context.Context, path string, how int) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("template lock: %w", err)
	}
	for {
		err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("template lock: %w", err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// buildWork is a build's work dir and its lease.
type buildWork struct {
	s     *Store
	dir   string
	lease *os.File
}

// newBuildWork makes <dir>/.build-<name>-<random> with a held lease.
func (s *Store) newBuildWork(ctx context.Context, name string) (*buildWork, error) {
	unlock, err := s.gcLock(ctx, false)
	if err != nil {
		return nil, err
	}
	defer unlock()
	dir := filepath.Join(s.dir, buildPrefix+name+"-"+randomSuffix())
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("build work dir: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, leaseFile), os.O_CREATE|os.O_RDWR|os.O_APPEND, 0o600)
	if err == nil {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	}
	if err != nil {
		if f != nil {
			f.Close()
		}
		_ = removeTree(dir)
		return nil, fmt.Errorf("build lease: %w", err)
	}
	return &buildWork{s: s, dir: dir, lease: f}, nil
}

// hold records layer ids in the lease (and, with mustExist, checks they
// exist), atomically with respect to GC: afterwards GC keeps them until the
// build ends.
func (w *buildWork) hold(ctx context.Context, mustExist bool, ids ...string) error {
	unlock, err := w.s.gcLock(ctx, false)
	if err != nil {
		return err
	}
	defer unlock()
	for _, id := range ids {
		if _, err := fmt.Fprintln(w.lease, id); err != nil {
			return fmt.Errorf("build lease: %w", err)
		}
		if mustExist && validLayerID(id) && !w.s.HasLayer(id) {
			return fmt.Errorf("layer %s is gone (collected while the build started?); start the build again", id[:12])
		}
	}
	return nil
}

// close releases the lease and removes the work dir.
func (w *buildWork) close(ctx context.Context) {
	w.lease.Close()
	if err := removeTree(w.dir); err != nil {
		w.s.log.WarnContext(ctx, "build cleanup incomplete", "dir", w.dir, "err", err)
	}
}

// liveLeases returns the layers leased by builds in flight and removes the
// work dirs of builds that are gone (a crash, kill -9). Call with the GC
// lock held exclusively.
func (s *Store) liveLeases(ctx context.Context) map[string]bool {
	refs := map[string]bool{}
	entries, _ := os.ReadDir(s.dir)
	for _, e := range entries {
		name := e.Name()
		dir := filepath.Join(s.dir, name)
		switch {
		case strings.HasPrefix(name, trashPrefix):
		case strings.HasPrefix(name, buildPrefix):
			f, err := os.Open(filepath.Join(dir, leaseFile))
			if err == nil {
				alive := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil
				if alive {
					sc := bufio.NewScanner(f)
					for sc.Scan() {
						refs[strings.TrimSpace(sc.Text())] = true
					}
				}
				f.Close()
				if alive {
					continue
				}
			}
		default:
			continue
		}
		s.log.InfoContext(ctx, "removing leftover of an interrupted build", "dir", dir)
		if err := removeTree(dir); err != nil {
			s.log.WarnContext(ctx, "leftover removal incomplete", "dir", dir, "err", err)
		}
	}
	// Layer work dirs of steps still running hold their lock file.
	layerEntries, _ := os.ReadDir(s.layersRoot())
	for _, e := range layerEntries {
		if strings.HasPrefix(e.Name(), layerTmp) {
			p := filepath.Join(s.layersRoot(), e.Name())
			if f, err := os.Open(filepath.Join(p, leaseFile)); err == nil {
				alive := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil
				f.Close()
				if alive {
					continue
				}
			}
			s.log.InfoContext(ctx, "removing leftover of an interrupted layer build", "dir", p)
			if err := removeTree(p); err != nil {
				s.log.WarnContext(ctx, "leftover removal incomplete", "dir", p, "err", err)
			}
		}
	}
	return refs
}
