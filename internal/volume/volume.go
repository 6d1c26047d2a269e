// Package volume keeps teams' persistent volumes: a volume is a directory
// tree owned by a team that outlives sandboxes, mounted into any number of
// the team's sandboxes (E2B's volumeMounts) and readable and writable
// without a sandbox through the volume content API (E2B's /volumecontent
// routes, authorised by a per-volume token).
//
// Each volume is its own ext4 filesystem in a sparse image file, made once
// at create (so its size limit holds: a write past it fails with ENOSPC in
// the volume only), loop-mounted by the server under the data dir, in a
// directory private to the server and named by an opaque key (no volume id
// or name in a host path, mount table or loop device). The sandbox side
// (one mount per sandbox, idmapped into its uid range) is
// internal/runtime/bundle's.
package volume

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/crashpoint"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/hostkey"
	"github.com/agentbox/agentbox/internal/runtime/bundle"
	"github.com/agentbox/agentbox/internal/store"
)

// Defaults of Config.
const (
	DefaultSizeMB     = 1024
	DefaultMaxSizeMB  = 16384
	DefaultMaxPerTeam = 100
	// DefaultMaxTotalMBPerTeam is Config.MaxTotalMBPerTeam's default.
	DefaultMaxTotalMBPerTeam = 262144
	DefaultTokenTTL          = 24 * time.Hour
	// MinSizeMB is the smallest volume (ext4 needs room for its metadata).
	MinSizeMB = 16
	// MaxNameLen is the longest volume name.
	MaxNameLen = 64
)

// Config configures a Service. Zero values take the defaults.
type Config struct {
	// Dir holds the volumes' images and mount points (made 0700). Required.
	Dir string
	// DefaultSizeMB is the size of a volume created without one.
	DefaultSizeMB int
	// MaxSizeMB is the largest size a create may ask for.
	MaxSizeMB int
	// MaxPerTeam is how many volumes one team may have.
	MaxPerTeam int
	// MaxTotalMBPerTeam is the most MiB the sizes of one team's volumes
	// may add up to (images are sparse, so this bounds what the team can
	// make the host's disk hold).
	MaxTotalMBPerTeam int
	// TokenTTL is how long a volume content token is valid.
	TokenTTL time.Duration
	// Crash kills the server after a named step (CrashSteps), for the
	// crash-safety tests; the zero value never does.
	Crash crashpoint.Switch
}

// Crash points of volume create and delete (--test-crash-after
// <operation>/<step>): Reconcile finishes or undoes what each leaves.
const (
	OpCreate        = "volume-create"
	OpDelete        = "volume-delete"
	StepMadeDisk    = "make disk"    // image, filesystem and host mount
	StepPersistRow  = "persist row"  // the volume exists
	StepDeleteRow   = "delete row"   // the volume is gone for the API
	StepRemoveFiles = "remove files" // image and mount gone
)

// CrashSteps lists the crash points of volume operations, in order, as
// operation and step.
func CrashSteps() [][2]string {
	return [][2]string{{OpCreate, StepMadeDisk}, {OpCreate, StepPersistRow}, {OpDelete, StepDeleteRow}, {OpDelete, StepRemoveFiles}}
}

// Service creates, finds, mounts and deletes volumes. Safe for concurrent
// use; a restarted server finds everything on disk and in the store.
type Service struct {
	cfg    Config
	st     *store.Store
	log    *slog.Logger
	keys   hostkey.Keyer
	secret []byte // signs content tokens

	mu       sync.Mutex
	claims   map[string]int  // volume id → sandbox starts holding it
	deleting map[string]bool // volume id → being deleted
	users    func(teamID, volumeID string) []string
	createMu sync.Mutex // one create at a time per server (the team cap)
	disk     DiskGuard  // nil: the host disk is not guarded (diskguard.go)
	mountMu  sync.Mutex // one host mount at a time
}

// New checks cfg and makes the volume directory.
func New(ctx context.Context, cfg Config, st *store.Store, log *slog.Logger) (*Service, error) {
	if cfg.Dir == "" {
		return nil, fmt.Errorf("volumes: Dir is required: %w", errdefs.ErrInvalidArgument)
	}
	if cfg.DefaultSizeMB == 0 {
		cfg.DefaultSizeMB = DefaultSizeMB
	}
	if cfg.MaxSizeMB == 0 {
		cfg.MaxSizeMB = DefaultMaxSizeMB
	}
	if cfg.MaxTotalMBPerTeam == 0 {
		cfg.MaxTotalMBPerTeam = DefaultMaxTotalMBPerTeam
	}
	if cfg.MaxPerTeam == 0 {
		cfg.MaxPerTeam = DefaultMaxPerTeam
	}
	if cfg.TokenTTL == 0 {
		cfg.TokenTTL = DefaultTokenTTL
	}
	if cfg.DefaultSizeMB < MinSizeMB || cfg.DefaultSizeMB > cfg.MaxSizeMB {
		return nil, fmt.Errorf("volumes: default size %d MiB must be from %d to the largest size, %d MiB: %w", cfg.DefaultSizeMB, MinSizeMB, cfg.MaxSizeMB, errdefs.ErrInvalidArgument)
	}
	if log == nil {
		log = slog.Default()
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("volumes: %w", err)
	}
	if err := os.Chmod(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("volumes: %w", err)
	}
	keys, err := hostkey.Load(filepath.Join(cfg.Dir, ".key-secret"))
	if err != nil {
		return nil, fmt.Errorf("volumes: %w", err)
	}
	secret, err := st.Secret(ctx, "volume-content-token")
	if err != nil {
		return nil, err
	}
	return &Service{cfg: cfg, st: st, log: log.With("component", "volume"), keys: keys, secret: secret,
		claims: map[string]int{}, deleting: map[string]bool{}}, nil
}

// SetUsers tells the service which sandboxes of a team mount a volume
// (running, paused or in a transition); a volume with users is not
// deleted. Call before serving.
func (s *Service) SetUsers(f func(teamID, volumeID string) []string) { s.users = f }

var validName = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// CheckName returns an errdefs.ErrInvalidArgument error naming the field
// for a name that is not a valid volume name.
func CheckName(field, name string) error {
	if name == "" || len(name) > MaxNameLen || !validName.MatchString(name) {
		shown := name
		if len(shown) > MaxNameLen {
			shown = shown[:MaxNameLen] + "…"
		}
		return fmt.Errorf("%s: %q is not a volume name: use 1 to %d letters, digits, '_' or '-': %w", field, shown, MaxNameLen, errdefs.ErrInvalidArgument)
	}
	return nil
}

// newID returns a random UUID (version 4), the shape of E2B's volume ids.
func newID() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// dir is volume id's host directory: <Dir>/<key>, holding disk.img and
// the mount point mnt.
func (s *Service) dir(id string) string { return filepath.Join(s.cfg.Dir, s.keys.Key(id)) }

func imagePath(dir string) string { return filepath.Join(dir, "disk.img") }
func mountPath(dir string) string { return filepath.Join(dir, "mnt") }

// Create makes a volume of sizeMB MiB (0: the default) for the team.
func (s *Service) Create(ctx context.Context, teamID, name string, sizeMB int) (store.Volume, error) {
	if err := CheckName("name", name); err != nil {
		return store.Volume{}, err
	}
	if sizeMB == 0 {
		sizeMB = s.cfg.DefaultSizeMB
	}
	if sizeMB < MinSizeMB || sizeMB > s.cfg.MaxSizeMB {
		return store.Volume{}, fmt.Errorf("sizeMB: %d MiB is not allowed; from %d to %d MiB on this server: %w", sizeMB, MinSizeMB, s.cfg.MaxSizeMB, errdefs.ErrInvalidArgument)
	}
	if err := s.admitDisk("create a volume"); err != nil {
		return store.Volume{}, err
	}
	s.createMu.Lock()
	defer s.createMu.Unlock()
	if _, err := s.st.VolumeByName(ctx, teamID, name); err == nil {
		return store.Volume{}, fmt.Errorf("name: the team already has a volume named %q: %w", name, errdefs.ErrConflict)
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return store.Volume{}, err
	}
	n, err := s.st.CountVolumes(ctx, teamID)
	if err != nil {
		return store.Volume{}, err
	}
	if n >= s.cfg.MaxPerTeam {
		return store.Volume{}, fmt.Errorf("the team has %d volumes, the most this server allows (agentbox serve --max-volumes); delete one first: %w", n, errdefs.ErrResourceExhausted)
	}
	vols, err := s.st.ListVolumes(ctx, teamID)
	if err != nil {
		return store.Volume{}, err
	}
	total := sizeMB
	for _, v := range vols {
		total += v.SizeMB
	}
	if total > s.cfg.MaxTotalMBPerTeam {
		return store.Volume{}, fmt.Errorf("sizeMB: the team's volumes would add up to %d MiB, more than the %d MiB this server allows a team (agentbox serve --volume-team-max-total-size); delete a volume or ask for less: %w", total, s.cfg.MaxTotalMBPerTeam, errdefs.ErrResourceExhausted)
	}
	v := store.Volume{ID: newID(), TeamID: teamID, Name: name, SizeMB: sizeMB, CreatedAt: time.Now().UTC()}
	dir := s.dir(v.ID)
	if err := s.makeDisk(ctx, dir, sizeMB); err != nil {
		_ = removeDir(dir)
		return store.Volume{}, fmt.Errorf("volume %q: %w", name, err)
	}
	s.cfg.Crash.After(OpCreate, StepMadeDisk)
	if err := s.st.CreateVolume(ctx, v); err != nil {
		_ = removeDir(dir)
		return store.Volume{}, err
	}
	s.cfg.Crash.After(OpCreate, StepPersistRow)
	s.log.Info("volume created", "volume", v.ID, "team", teamID, "size_mb", sizeMB)
	return v, nil
}

// makeDisk makes dir with a fresh ext4 image of mb MiB, mounts it and
// prepares its root.
func (s *Service) makeDisk(ctx context.Context, dir string, mb int) error {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	img := imagePath(dir)
	f, err := os.OpenFile(img, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(int64(mb) << 20)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	// The journal keeps the volume consistent across a host crash; its
	// blocks and the inode tables are holes of the sparse image, which
	// read as zeros, so nothing needs zeroing. No reserved blocks: the
	// sandbox's root gets all of it.
	out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-m", "0",
		"-E", "root_owner=0:0,lazy_itable_init=1,lazy_journal_init=1", img).CombinedOutput()
	if err != nil {
		return fmt.Errorf("format: %w: %s", err, strings.TrimSpace(string(out)))
	}
	if err := os.Mkdir(mountPath(dir), 0o700); err != nil {
		return err
	}
	mnt, err := s.mount(dir)
	if err != nil {
		return err
	}
	// lost+found is e2fsck's, not the team's; the root is every sandbox
	// user's (a PATCH of path "/" changes that).
	_ = os.Remove(filepath.Join(mnt, "lost+found"))
	return os.Chmod(mnt, 0o777)
}

// mount mounts volume dir's image at its mount point if it is not mounted
// yet and returns the mount point. The filesystem may still be mounted
// through a sandbox while the host mount is gone (a server that lost its
// mount): its loop device is reused, since a second device on the same
// image would be a second ext4 instance writing the same blocks.
func (s *Service) mount(dir string) (string, error) {
	mnt := mountPath(dir)
	s.mountMu.Lock()
	defer s.mountMu.Unlock()
	if bundle.IsMountPoint(mnt) {
		return mnt, nil
	}
	img := imagePath(dir)
	dev := loopOf(img)
	if dev == "" {
		d, f, err := bundle.AttachLoop(img)
		if err != nil {
			return "", err
		}
		defer f.Close() // the mount holds the device; autoclear frees it at the last unmount
		dev = d
	}
	if err := unix.Mount(dev, mnt, "ext4", unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return "", fmt.Errorf("mount volume: %w", err)
	}
	return mnt, nil
}

// loopOf returns the loop device whose backing file is img, if any. The
// file is matched by device and inode (LOOP_GET_STATUS64), not by the path
// the device recorded, which another spelling of the data dir would miss.
func loopOf(img string) string {
	var st unix.Stat_t
	if err := unix.Stat(img, &st); err != nil {
		return ""
	}
	m, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, p := range m {
		dev := "/dev/" + filepath.Base(filepath.Dir(filepath.Dir(p)))
		fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		info, err := unix.IoctlLoopGetStatus64(fd)
		unix.Close(fd)
		if err == nil && info.Inode == st.Ino && info.Device == st.Dev {
			return dev
		}
	}
	return ""
}

// removeDir unmounts and removes a volume's host directory.
func removeDir(dir string) error {
	mnt := mountPath(dir)
	for range 100 {
		if !bundle.IsMountPoint(mnt) || unix.Unmount(mnt, unix.MNT_DETACH) != nil {
			break
		}
	}
	if bundle.IsMountPoint(mnt) {
		return fmt.Errorf("volume dir %s: still mounted", dir)
	}
	return os.RemoveAll(dir)
}

// Get returns the team's volume id; another team's is not found.
func (s *Service) Get(ctx context.Context, teamID, id string) (store.Volume, error) {
	return s.st.Volume(ctx, teamID, id)
}

// List returns the team's volumes.
func (s *Service) List(ctx context.Context, teamID string) ([]store.Volume, error) {
	return s.st.ListVolumes(ctx, teamID)
}

// Delete removes the team's volume and its files. A volume that a sandbox
// of the team mounts (running, paused, or being started) is a conflict
// naming them: its files would vanish under them.
func (s *Service) Delete(ctx context.Context, teamID, id string) error {
	s.mu.Lock()
	v, err := s.st.Volume(ctx, teamID, id)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	if s.deleting[id] {
		s.mu.Unlock()
		return fmt.Errorf("volume %q is being deleted: %w", v.Name, errdefs.ErrConflict)
	}
	if n := s.claims[id]; n > 0 {
		s.mu.Unlock()
		return fmt.Errorf("volume %q is being mounted into %d starting sandbox(es); kill them first: %w", v.Name, n, errdefs.ErrConflict)
	}
	if s.users != nil {
		if ids := s.users(teamID, id); len(ids) > 0 {
			s.mu.Unlock()
			slices.Sort(ids)
			return fmt.Errorf("volume %q is mounted by sandbox(es) %s; kill them first: %w", v.Name, strings.Join(ids, ", "), errdefs.ErrConflict)
		}
	}
	s.deleting[id] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.deleting, id)
		s.mu.Unlock()
	}()
	if err := s.st.DeleteVolume(ctx, teamID, id); err != nil {
		return err
	}
	s.cfg.Crash.After(OpDelete, StepDeleteRow)
	if err := removeDir(s.dir(id)); err != nil {
		// The row is gone: the next start removes what is left.
		s.log.Error("volume files not removed; the next start retries", "volume", id, "err", err)
	}
	s.cfg.Crash.After(OpDelete, StepRemoveFiles)
	s.log.Info("volume deleted", "volume", id, "team", teamID)
	return nil
}

// Mounted is a volume claimed for a sandbox: its host mount point.
type Mounted struct {
	store.Volume
	HostPath string
}

// Claim resolves the team's volumes by name (byID false) or id, mounts
// them on the host and holds them against deletion until release is
// called (by then the sandbox that mounts them is registered, and Delete
// asks the users function). A missing volume, or another team's, is an
// errdefs.ErrInvalidArgument error naming it.
func (s *Service) Claim(ctx context.Context, teamID string, refs []string, byID bool) (out []Mounted, release func(), err error) {
	var held []string
	undo := func() {
		s.mu.Lock()
		for _, id := range held {
			if s.claims[id]--; s.claims[id] <= 0 {
				delete(s.claims, id)
			}
		}
		held = nil
		s.mu.Unlock()
	}
	defer func() {
		if err != nil {
			undo()
		}
	}()
	for _, ref := range refs {
		var v store.Volume
		if byID {
			v, err = s.st.Volume(ctx, teamID, ref)
		} else {
			v, err = s.st.VolumeByName(ctx, teamID, ref)
		}
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil, nil, fmt.Errorf("volume %q not found; create it with POST /volumes (Volume.create): %w", ref, errdefs.ErrInvalidArgument)
		}
		if err != nil {
			return nil, nil, err
		}
		s.mu.Lock()
		if s.deleting[v.ID] {
			s.mu.Unlock()
			return nil, nil, fmt.Errorf("volume %q is being deleted: %w", ref, errdefs.ErrConflict)
		}
		s.claims[v.ID]++
		held = append(held, v.ID)
		s.mu.Unlock()
		// A delete that finished between the lookup and the claim.
		if _, err := s.st.Volume(ctx, teamID, v.ID); err != nil {
			if errors.Is(err, errdefs.ErrNotFound) {
				return nil, nil, fmt.Errorf("volume %q not found: %w", ref, errdefs.ErrInvalidArgument)
			}
			return nil, nil, err
		}
		mnt, err := s.mount(s.dir(v.ID))
		if err != nil {
			return nil, nil, fmt.Errorf("volume %q: %w", ref, err)
		}
		out = append(out, Mounted{Volume: v, HostPath: mnt})
	}
	return out, undo, nil
}

// Reconcile removes what a crash left: host directories of volumes that
// have no row (a create or delete that did not finish), and the staged
// files of replacing writes that did not finish (writesteps.go).
func (s *Service) Reconcile(ctx context.Context) error {
	vols, err := s.st.ListVolumes(ctx, "")
	if err != nil {
		return err
	}
	known := map[string]bool{}
	for _, v := range vols {
		known[s.keys.Key(v.ID)] = true
	}
	entries, err := os.ReadDir(s.cfg.Dir)
	if err != nil {
		return fmt.Errorf("volumes: %w", err)
	}
	for _, e := range entries {
		if !e.IsDir() || !hostkey.IsKey(e.Name()) || known[e.Name()] {
			continue
		}
		s.log.Warn("removing files of a volume that no longer exists", "dir", e.Name())
		if err := removeDir(filepath.Join(s.cfg.Dir, e.Name())); err != nil {
			s.log.Error("remove leftover volume files", "dir", e.Name(), "err", err)
		}
	}
	for _, v := range vols {
		if _, err := os.Stat(imagePath(s.dir(v.ID))); errors.Is(err, fs.ErrNotExist) {
			s.log.Error("volume has no image on disk; mounting it will fail", "volume", v.ID, "team", v.TeamID)
			continue
		}
		if err := s.finishWrites(ctx, v); err != nil {
			s.log.Error("finish interrupted volume writes", "volume", v.ID, "err", err)
		}
	}
	return nil
}

// ---- content tokens ----

// tokenPrefix starts every volume content token.
const tokenPrefix = "vol1."

// Token returns a content token for v, valid for Config.TokenTTL: an
// expiry and an HMAC, under the server's secret, of the volume, its team
// and the expiry. It is never stored; another volume's, another team's
// or an expired token does not verify.
func (s *Service) Token(v store.Volume) string {
	exp := time.Now().Add(s.cfg.TokenTTL).Unix()
	return tokenPrefix + strconv.FormatInt(exp, 10) + "." + s.mac(v.ID, v.TeamID, exp)
}

func (s *Service) mac(id, teamID string, exp int64) string {
	m := hmac.New(sha256.New, s.secret)
	fmt.Fprintf(m, "volume-content\x00%s\x00%s\x00%d", id, teamID, exp)
	return hex.EncodeToString(m.Sum(nil))
}

// Authorize checks token against volume id and returns the volume. Every
// failure, a missing volume included, is errdefs.ErrUnauthenticated: a
// caller without a valid token learns nothing about which ids exist.
func (s *Service) Authorize(ctx context.Context, id, token string) (store.Volume, error) {
	bad := func(why string) error {
		return fmt.Errorf("volume token %s; get a fresh one with GET /volumes/{volumeID} (Volume.connect): %w", why, errdefs.ErrUnauthenticated)
	}
	rest, ok := strings.CutPrefix(token, tokenPrefix)
	if !ok {
		return store.Volume{}, bad("missing or malformed (send Authorization: Bearer <the volume's token>)")
	}
	expS, sig, ok := strings.Cut(rest, ".")
	exp, err := strconv.ParseInt(expS, 10, 64)
	if !ok || err != nil || len(sig) != 64 {
		return store.Volume{}, bad("malformed")
	}
	v, err := s.st.VolumeByID(ctx, id)
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return store.Volume{}, err
	}
	// Compared even for a missing volume, so both take the same time.
	if !hmac.Equal([]byte(sig), []byte(s.mac(id, v.TeamID, exp))) || v.ID == "" {
		return store.Volume{}, bad("is not valid for this volume")
	}
	if time.Now().Unix() > exp {
		return store.Volume{}, bad("has expired")
	}
	return v, nil
}

// Files opens v's file tree for the content API, mounting it if needed.
// The caller closes it.
func (s *Service) Files(ctx context.Context, v store.Volume) (*Files, error) {
	mnt, err := s.mount(s.dir(v.ID))
	if err != nil {
		return nil, fmt.Errorf("volume %q: %w", v.Name, err)
	}
	root, err := os.OpenRoot(mnt)
	if err != nil {
		return nil, fmt.Errorf("volume %q: %w", v.Name, err)
	}
	return &Files{root: root, sizeMB: v.SizeMB, disk: s.disk, pending: pendingDir(s.dir(v.ID)), crash: s.cfg.Crash}, nil
}

// Close detaches the host mounts of every volume, at server shutdown: a
// volume that running or paused sandboxes mount keeps its filesystem
// through their mounts, and the next start mounts it again on the same loop
// device (mount), so a stopped server leaves only what its sandboxes hold.
func (s *Service) Close() {
	s.mountMu.Lock()
	defer s.mountMu.Unlock()
	entries, err := os.ReadDir(s.cfg.Dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !e.IsDir() || !hostkey.IsKey(e.Name()) {
			continue
		}
		mnt := mountPath(filepath.Join(s.cfg.Dir, e.Name()))
		for range 100 {
			if !bundle.IsMountPoint(mnt) || unix.Unmount(mnt, unix.MNT_DETACH) != nil {
				break
			}
		}
	}
}
