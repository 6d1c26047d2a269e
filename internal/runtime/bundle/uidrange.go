package bundle

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// Each container-tier sandbox in a user namespace gets a host id range of
// its own (UserNSSize ids from a pool of UserNSRanges ranges starting at
// UserNSBase), so what escapes one sandbox's mount namespace is a host uid
// that owns none of another sandbox's files: not its writable layer, its
// bundle or its memory images.
//
// A range is in use while any file owned by it may exist. The pool keeps,
// per range, the paths that hold such files: the sandbox's bundle and the
// memory images taken of it (memory images keep their owners; a restore
// from one runs in the range it was taken in, because CRIU recreates the
// user namespace with the id mappings in the image). A range whose holders
// are all gone from disk is free again. Captured writable layers are stored
// unshifted (captureUpper), so they hold no range.

// DefaultUserNSRanges is the default number of ranges in the pool.
const DefaultUserNSRanges = 4096

// uidPool allocates host id ranges. Its state is on disk, so a restarted
// server sees every range its sandboxes and images still hold: per range in
// use, a file (<dir>/<first host id>) listing the paths holding it (bundle
// dirs, which never move) and a directory (<dir>/<first host id>.links) of
// hard links to a marker file inside each memory image, which hold the
// range for as long as the marker exists anywhere (its link count), however
// the image's directory is renamed or moved afterwards.
type uidPool struct {
	dir   string
	base  uint32 // first id of the first range
	size  uint32 // ids per range
	count uint32 // ranges in the pool

	mu   sync.Mutex
	next uint32 // where the search for a free range starts
}

// file is the holder list of the range starting at base.
func (p *uidPool) file(base uint32) string {
	return filepath.Join(p.dir, strconv.FormatUint(uint64(base), 10))
}

// holders reads the live holders of the range at base (paths still on disk).
func (p *uidPool) holders(base uint32) ([]string, error) {
	b, err := os.ReadFile(p.file(base))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var live []string
	for h := range strings.Lines(string(b)) {
		h = strings.TrimSpace(h)
		if h == "" {
			continue
		}
		if _, err := os.Lstat(h); err == nil {
			live = append(live, h)
		}
	}
	return live, nil
}

// write records holders as the range's (atomically).
func (p *uidPool) write(base uint32, holders []string) error {
	tmp := p.file(base) + ".tmp"
	if err := os.WriteFile(tmp, []byte(strings.Join(holders, "\n")+"\n"), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, p.file(base))
}

// alloc hands out a free range, held by holder from now on.
func (p *uidPool) alloc(holder string) (uint32, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := os.MkdirAll(p.dir, 0o700); err != nil {
		return 0, fmt.Errorf("uid ranges: %w", err)
	}
	for i := range p.count {
		n := (p.next + i) % p.count
		base := p.base + n*p.size
		live, err := p.holders(base)
		if err != nil {
			return 0, fmt.Errorf("uid range %d: %w", base, err)
		}
		if len(live) > 0 || p.linked(base) {
			continue
		}
		if err := p.write(base, []string{holder}); err != nil {
			return 0, fmt.Errorf("uid range %d: %w", base, err)
		}
		p.next = (n + 1) % p.count
		return base, nil
	}
	return 0, fmt.Errorf("all %d host uid ranges are held by sandboxes or their memory images; delete some or raise the pool size: %w", p.count, errdefs.ErrResourceExhausted)
}

// hold adds holder to the range at base (a memory image of it, or a sandbox
// restored from one).
func (p *uidPool) hold(base uint32, holder string) error {
	if !p.contains(base) {
		return fmt.Errorf("host uid %d does not start a range of the pool: %w", base, errdefs.ErrInvalidArgument)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := os.MkdirAll(p.dir, 0o700); err != nil {
		return err
	}
	live, err := p.holders(base)
	if err != nil {
		return err
	}
	for _, h := range live {
		if h == holder {
			return nil
		}
	}
	return p.write(base, append(live, holder))
}

// holdLinked holds the range at base for as long as file (inside a memory
// image) exists, wherever it is moved on this filesystem.
func (p *uidPool) holdLinked(base uint32, file string) error {
	if !p.contains(base) {
		return fmt.Errorf("host uid %d does not start a range of the pool: %w", base, errdefs.ErrInvalidArgument)
	}
	dir := p.file(base) + ".links"
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		return err
	}
	return os.Link(file, filepath.Join(dir, hex.EncodeToString(b[:])))
}

// linked reports whether a marker linked to the range at base still exists
// outside the pool (link count above one); links whose marker is gone are
// removed.
func (p *uidPool) linked(base uint32) bool {
	dir := p.file(base) + ".links"
	entries, err := os.ReadDir(dir)
	if err != nil {
		return !errors.Is(err, fs.ErrNotExist) // unreadable: assume held
	}
	held := false
	for _, e := range entries {
		var st unix.Stat_t
		path := filepath.Join(dir, e.Name())
		if err := unix.Lstat(path, &st); err != nil {
			continue
		}
		if st.Nlink > 1 {
			held = true
			continue
		}
		_ = os.Remove(path)
	}
	return held
}

// contains reports whether base starts one of the pool's ranges.
func (p *uidPool) contains(base uint32) bool {
	return base >= p.base && (base-p.base)%p.size == 0 && (base-p.base)/p.size < p.count
}

// rangeOf returns the start of the pool range holding host id uid.
func (p *uidPool) rangeOf(uid uint32) (uint32, bool) {
	if uid < p.base || (uid-p.base)/p.size >= p.count {
		return 0, false
	}
	return p.base + (uid-p.base)/p.size*p.size, true
}

// imageRangeFile records, in a memory image, the host id range of the
// sandbox it was taken of.
const imageRangeFile = "agentbox-uid-range"

// WriteImageRange records base in image dir img and holds the range for
// as long as the record exists (the caller may move the image dir).
func (s *Store) WriteImageRange(img string, base uint32) error {
	marker := filepath.Join(img, imageRangeFile)
	if err := os.WriteFile(marker, []byte(strconv.FormatUint(uint64(base), 10)+"\n"), 0o600); err != nil {
		return err
	}
	err := s.uids.holdLinked(base, marker)
	if errors.Is(err, unix.EXDEV) {
		// Another filesystem: held by its path, which must then not move.
		s.log.Warn("memory image on another filesystem than the uid range records; its range is held by its path only", "image", img)
		return s.uids.hold(base, filepath.Clean(img))
	}
	return err
}

// ImageRange reads the range recorded in image dir img (ok false if none).
func ImageRange(img string) (uint32, bool) {
	b, err := os.ReadFile(filepath.Join(img, imageRangeFile))
	if err != nil {
		return 0, false
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 32)
	return uint32(v), err == nil
}

// BundleRange returns the first host id of the bundle's user namespace
// (ok false when it has none).
func BundleRange(dir string) (uint32, bool) {
	oci, err := ReadSpec(dir)
	if err != nil || oci.Linux == nil || len(oci.Linux.UIDMappings) == 0 {
		return 0, false
	}
	return oci.Linux.UIDMappings[0].HostID, true
}
