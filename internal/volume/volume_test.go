package volume

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/runtime/bundle"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/testutil"
)

type env struct {
	s      *Service
	st     *store.Store
	dir    string
	a, b   string // teams
	mu     sync.Mutex
	inUse  map[string][]string // volume id → sandboxes
	closed bool
}

func newEnv(t *testing.T, cfg Config) *env {
	t.Helper()
	ctx := context.Background()
	base := t.TempDir()
	st, err := store.Open(ctx, filepath.Join(base, "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if cfg.Dir == "" {
		cfg.Dir = filepath.Join(base, "volumes")
	}
	s, err := New(ctx, cfg, st, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	e := &env{s: s, st: st, dir: cfg.Dir, inUse: map[string][]string{}}
	s.SetUsers(func(team, id string) []string {
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.inUse[id]
	})
	t.Cleanup(func() {
		// Detach every mount so the temp dir can go.
		s.Close()
	})
	a, _ := st.EnsureTeam(ctx, "a")
	b, _ := st.EnsureTeam(ctx, "b")
	e.a, e.b = a.ID, b.ID
	return e
}

func TestTokens(t *testing.T) {
	e := newEnv(t, Config{})
	ctx := context.Background()
	va := store.Volume{ID: newID(), TeamID: e.a, Name: "x", SizeMB: 16}
	vb := store.Volume{ID: newID(), TeamID: e.b, Name: "x", SizeMB: 16}
	for _, v := range []store.Volume{va, vb} {
		if err := e.st.CreateVolume(ctx, v); err != nil {
			t.Fatal(err)
		}
	}
	tok := e.s.Token(va)
	if got, err := e.s.Authorize(ctx, va.ID, tok); err != nil || got.ID != va.ID || got.TeamID != e.a {
		t.Fatalf("own token: %+v %v", got, err)
	}
	key, _, _ := e.st.CreateAPIKey(ctx, e.a, "k")
	for name, tc := range map[string]struct{ id, tok string }{
		"other volume's token":    {vb.ID, tok},
		"tampered":                {va.ID, tok[:len(tok)-1] + string("0123456789abcdef"[(strings.IndexByte("0123456789abcdef", tok[len(tok)-1])+1)%16])},
		"later expiry":            {va.ID, strings.Replace(tok, ".1", ".9", 1)},
		"missing volume":          {newID(), tok},
		"the team's API key":      {va.ID, key},
		"empty":                   {va.ID, ""},
		"prefix only":             {va.ID, tokenPrefix},
		"token of another team's": {va.ID, e.s.Token(vb)},
	} {
		if _, err := e.s.Authorize(ctx, tc.id, tc.tok); !errors.Is(err, errdefs.ErrUnauthenticated) {
			t.Errorf("%s: %v, want unauthenticated", name, err)
		}
	}
	expired := &Service{cfg: Config{TokenTTL: -time.Minute}, st: e.st, secret: e.s.secret}
	if _, err := e.s.Authorize(ctx, va.ID, expired.Token(va)); !errors.Is(err, errdefs.ErrUnauthenticated) || !strings.Contains(err.Error(), "expired") {
		t.Errorf("expired token: %v", err)
	}
	// A volume deleted and its token: refused.
	if err := e.st.DeleteVolume(ctx, e.a, va.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Authorize(ctx, va.ID, tok); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("token of a deleted volume: %v", err)
	}
}

func TestCheckName(t *testing.T) {
	for _, ok := range []string{"a", "ws-1", "A_b", strings.Repeat("x", MaxNameLen)} {
		if err := CheckName("name", ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "a b", "a/b", "..", "a.b", "ü", strings.Repeat("x", MaxNameLen+1), "a\x00"} {
		if err := CheckName("name", bad); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.HasPrefix(err.Error(), "name:") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

// TestVolumeLifecycle (root: loop devices, mounts): create, team
// isolation, claims and users holding a volume against deletion, the size
// limit, and cleanup.
func TestVolumeLifecycle(t *testing.T) {
	testutil.RequireRoot(t)
	e := newEnv(t, Config{DefaultSizeMB: 16, MaxSizeMB: 64, MaxPerTeam: 2})
	ctx := context.Background()
	v, err := e.s.Create(ctx, e.a, "ws", 0)
	if err != nil {
		t.Fatal(err)
	}
	if v.SizeMB != 16 || v.Name != "ws" || len(v.ID) != 36 {
		t.Fatalf("created %+v", v)
	}
	for name, tc := range map[string]struct {
		team, vol string
		size      int
		want      error
	}{
		"same name":      {e.a, "ws", 0, errdefs.ErrConflict},
		"bad name":       {e.a, "w s", 0, errdefs.ErrInvalidArgument},
		"too big":        {e.a, "big", 65, errdefs.ErrInvalidArgument},
		"too small":      {e.a, "small", 1, errdefs.ErrInvalidArgument},
		"same name in b": {e.b, "ws", 0, nil},
	} {
		_, err := e.s.Create(ctx, tc.team, tc.vol, tc.size)
		if (tc.want == nil && err != nil) || (tc.want != nil && !errors.Is(err, tc.want)) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
	if _, err := e.s.Create(ctx, e.a, "second", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Create(ctx, e.a, "third", 0); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("past MaxPerTeam: %v", err)
	}
	// Another team neither sees, claims nor deletes it.
	if _, err := e.s.Get(ctx, e.b, v.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("team b gets team a's volume: %v", err)
	}
	if err := e.s.Delete(ctx, e.b, v.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("team b deletes team a's volume: %v", err)
	}
	if _, _, err := e.s.Claim(ctx, e.b, []string{v.ID}, true); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("team b claims team a's volume by id: %v", err)
	}
	// Team b's own "ws" is its own volume.
	mb, rel, err := e.s.Claim(ctx, e.b, []string{"ws"}, false)
	if err != nil || mb[0].ID == v.ID || mb[0].TeamID != e.b {
		t.Fatalf("team b claims its ws: %+v %v", mb, err)
	}
	rel()

	m, release, err := e.s.Claim(ctx, e.a, []string{"ws"}, false)
	if err != nil || len(m) != 1 || m[0].ID != v.ID || !bundle.IsMountPoint(m[0].HostPath) {
		t.Fatalf("claim: %+v %v", m, err)
	}
	if err := e.s.Delete(ctx, e.a, v.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("delete while claimed: %v", err)
	}
	release()
	e.mu.Lock()
	e.inUse[v.ID] = []string{"isb2", "isb1"}
	e.mu.Unlock()
	if err := e.s.Delete(ctx, e.a, v.ID); !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "isb1, isb2") {
		t.Fatalf("delete while mounted: %v", err)
	}
	e.mu.Lock()
	delete(e.inUse, v.ID)
	e.mu.Unlock()

	// The size limit: the content API's write fails with ErrNoSpace and
	// keeps nothing; what fits is written.
	f, err := e.s.Files(ctx, v)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.Write("/big", io.LimitReader(zeros{}, 32<<20), Meta{}, false)
	if !errors.Is(err, errdefs.ErrNoSpace) {
		t.Fatalf("write past the size: %v", err)
	}
	if _, err := f.Stat("/big"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("a failed write left its file: %v", err)
	}
	if _, err := f.Write("/small", bytes.NewReader(make([]byte, 1<<20)), Meta{}, false); err != nil {
		t.Fatalf("1 MiB after the failed write: %v", err)
	}
	f.Close()
	// The host mount goes at Close and comes back on the next use.
	e.s.Close()
	if bundle.IsMountPoint(m[0].HostPath) {
		t.Fatal("mount left after Close")
	}
	f, err = e.s.Files(ctx, v)
	if err != nil {
		t.Fatal(err)
	}
	if e, err := f.Stat("/small"); err != nil || e.Size != 1<<20 {
		t.Fatalf("after a remount: %+v %v", e, err)
	}
	f.Close()

	dir := e.s.dir(v.ID)
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("volume dir %v %v", fi, err)
	}
	if fi, err := os.Stat(e.dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("volumes dir %v %v", fi, err)
	}
	if strings.Contains(dir, v.ID) || strings.Contains(dir, v.Name) {
		t.Fatalf("host path %s names the volume", dir)
	}
	if err := e.s.Delete(ctx, e.a, v.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("volume dir after delete: %v", err)
	}
	if _, _, err := e.s.Claim(ctx, e.a, []string{"ws"}, false); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("claim a deleted volume: %v", err)
	}

	// Reconcile removes the files of a volume without a row.
	orphan := filepath.Join(e.dir, e.s.keys.Key(newID()))
	if err := e.s.makeDisk(ctx, orphan, 16); err != nil {
		t.Fatal(err)
	}
	if err := e.s.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(orphan); !os.IsNotExist(err) {
		t.Fatalf("orphan left: %v", err)
	}
	if list, _ := e.s.List(ctx, e.a); len(list) != 1 || list[0].Name != "second" {
		t.Fatalf("team a's volumes after all: %+v", list)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// TestRemountSharesTheFilesystem (root): after the server's own mount is
// gone while a sandbox still holds the filesystem, the next mount is of
// that very filesystem (one loop device): a second one over the same image
// would be a second ext4 instance writing the same blocks.
func TestRemountSharesTheFilesystem(t *testing.T) {
	testutil.RequireRoot(t)
	e := newEnv(t, Config{DefaultSizeMB: 16})
	ctx := context.Background()
	v, err := e.s.Create(ctx, e.a, "shared", 0)
	if err != nil {
		t.Fatal(err)
	}
	m, release, err := e.s.Claim(ctx, e.a, []string{"shared"}, false)
	if err != nil {
		t.Fatal(err)
	}
	release()
	// A sandbox's mount: a clone of the server's.
	held := filepath.Join(t.TempDir(), "sandbox")
	if err := os.Mkdir(held, 0o755); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.OpenTree(unix.AT_FDCWD, m[0].HostPath, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	err = unix.MoveMount(fd, "", unix.AT_FDCWD, held, unix.MOVE_MOUNT_F_EMPTY_PATH)
	unix.Close(fd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(held, unix.MNT_DETACH) })
	e.s.Close()
	if bundle.IsMountPoint(m[0].HostPath) {
		t.Fatal("the server's mount is still there after Close")
	}
	// Through the sandbox's mount, then through the remounted server's.
	if err := os.WriteFile(filepath.Join(held, "from-sandbox"), []byte("s"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := e.s.Files(ctx, v)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Stat("/from-sandbox"); err != nil {
		t.Fatalf("the remounted volume does not see the sandbox's write: %v", err)
	}
	if _, err := f.Write("/from-api", strings.NewReader("a"), Meta{}, false); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(held, "from-api")); err != nil || string(b) != "a" {
		t.Fatalf("the sandbox does not see the API's write: %q %v", b, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(imagePath(e.s.dir(v.ID)), &st); err != nil {
		t.Fatal(err)
	}
	n := 0
	devs, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, p := range devs {
		fd, err := unix.Open("/dev/"+filepath.Base(filepath.Dir(filepath.Dir(p))), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		info, err := unix.IoctlLoopGetStatus64(fd)
		unix.Close(fd)
		if err == nil && info.Inode == st.Ino && info.Device == st.Dev {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("the image is on %d loop devices", n)
	}
}

// TestVolumeTeamTotalSize (root): the sizes of a team's volumes add up to
// at most MaxTotalMBPerTeam; the refusal names the limit and its flag, and
// another team's quota is its own.
func TestVolumeTeamTotalSize(t *testing.T) {
	testutil.RequireRoot(t)
	e := newEnv(t, Config{DefaultSizeMB: 16, MaxSizeMB: 64, MaxTotalMBPerTeam: 80})
	ctx := context.Background()
	for _, tc := range []struct {
		team, name string
		size       int
		want       error
	}{
		{e.a, "big", 64, nil},
		{e.a, "over", 32, errdefs.ErrResourceExhausted},
		{e.b, "theirs", 64, nil},
		{e.a, "fits", 16, nil},
		{e.a, "one-more", 16, errdefs.ErrResourceExhausted},
	} {
		_, err := e.s.Create(ctx, tc.team, tc.name, tc.size)
		if (tc.want == nil && err != nil) || (tc.want != nil && !errors.Is(err, tc.want)) {
			t.Fatalf("%s: %v, want %v", tc.name, err, tc.want)
		}
		if err != nil && (!strings.Contains(err.Error(), "80 MiB") || !strings.Contains(err.Error(), "--volume-team-max-total-size")) {
			t.Errorf("%s: the refusal does not name the limit and how to raise it: %v", tc.name, err)
		}
	}
}
