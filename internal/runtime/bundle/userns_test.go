package bundle

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/testutil"
)

func TestShiftTree(t *testing.T) {
	testutil.RequireRoot(t)
	root := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Mkdir(filepath.Join(root, "home"), 0o755))
	must(os.WriteFile(filepath.Join(root, "home", "f"), []byte("x"), 0o644))
	must(os.Chown(filepath.Join(root, "home", "f"), 1000, 1000))
	must(os.Link(filepath.Join(root, "home", "f"), filepath.Join(root, "link")))
	must(os.WriteFile(filepath.Join(root, "sudo"), []byte("x"), 0o755))
	must(os.Chmod(filepath.Join(root, "sudo"), 0o755|os.ModeSetuid))
	must(os.Symlink("home/f", filepath.Join(root, "sym")))
	must(shiftTree(root, 0, 100000, 65536))

	for _, tc := range []struct {
		path     string
		uid, gid uint32
		mode     uint32 // permission and setuid bits; 0 = not checked
	}{
		{".", 100000, 100000, 0},
		{"home/f", 101000, 101000, 0o644},
		{"link", 101000, 101000, 0}, // a hardlink is shifted once, not twice
		{"sudo", 100000, 100000, 0o755 | unix.S_ISUID},
		{"sym", 100000, 100000, 0},
	} {
		var st unix.Stat_t
		must(unix.Lstat(filepath.Join(root, tc.path), &st))
		if st.Uid != tc.uid || st.Gid != tc.gid {
			t.Errorf("%s: owner %d:%d, want %d:%d", tc.path, st.Uid, st.Gid, tc.uid, tc.gid)
		}
		if tc.mode != 0 && st.Mode&0o7777 != tc.mode {
			t.Errorf("%s: mode %o, want %o", tc.path, st.Mode&0o7777, tc.mode)
		}
	}
}

func TestShiftTreeRefusesUnmappedOwner(t *testing.T) {
	testutil.RequireRoot(t)
	root := t.TempDir()
	f := filepath.Join(root, "f")
	if err := os.WriteFile(f, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(f, 70000, 0); err != nil {
		t.Fatal(err)
	}
	if err := shiftTree(root, 0, 100000, 65536); err == nil {
		t.Fatal("an owner outside the mapped range was shifted")
	}
}

func TestCapsV3(t *testing.T) {
	v2 := make([]byte, vfsCapV2Size)
	binary.LittleEndian.PutUint32(v2, 0x02000001) // revision 2, effective
	binary.LittleEndian.PutUint32(v2[4:], 1<<13)  // CAP_NET_RAW permitted
	v3 := append(append([]byte{}, v2...), 0, 0, 0, 0)
	binary.LittleEndian.PutUint32(v3, 0x03000001)
	for _, tc := range []struct {
		name string
		in   []byte
	}{
		{"v2", v2},
		{"v3 of another root", v3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := capsV3(tc.in, 100000)
			if len(out) != vfsCapV2Size+4 {
				t.Fatalf("len %d", len(out))
			}
			if m := binary.LittleEndian.Uint32(out); m != 0x03000001 {
				t.Errorf("magic %#x", m)
			}
			if p := binary.LittleEndian.Uint32(out[4:]); p != 1<<13 {
				t.Errorf("permitted %#x", p)
			}
			if r := binary.LittleEndian.Uint32(out[vfsCapV2Size:]); r != 100000 {
				t.Errorf("rootid %d", r)
			}
		})
	}
}

func TestOCISpecUserNS(t *testing.T) {
	for _, tc := range []struct {
		name      string
		userns    bool
		wantUserN bool
	}{
		{name: "off"},
		{name: "on", userns: true, wantUserN: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Store{cfg: Config{UserNS: tc.userns, UserNSBase: DefaultUserNSBase, UserNSSize: DefaultUserNSSize, EnvdPath: "/envd"}}
			s := r.OCISpec(runtime.Spec{ID: "x"}, t.TempDir(), Options{UserNS: tc.userns}, DefaultUserNSBase)
			hasUserNS := slices.ContainsFunc(s.Linux.Namespaces, func(n specs.LinuxNamespace) bool { return n.Type == specs.UserNamespace })
			if hasUserNS != tc.wantUserN {
				t.Fatalf("user namespace = %v, want %v", hasUserNS, tc.wantUserN)
			}
			var sys specs.Mount
			for _, m := range s.Mounts {
				if m.Destination == "/sys" {
					sys = m
				}
			}
			if !tc.wantUserN {
				if len(s.Linux.UIDMappings) != 0 || sys.Type != "sysfs" {
					t.Fatalf("mappings %v, /sys %v", s.Linux.UIDMappings, sys)
				}
				return
			}
			want := []specs.LinuxIDMapping{{ContainerID: 0, HostID: DefaultUserNSBase, Size: DefaultUserNSSize}}
			if !slices.Equal(s.Linux.UIDMappings, want) || !slices.Equal(s.Linux.GIDMappings, want) {
				t.Errorf("mappings %v %v", s.Linux.UIDMappings, s.Linux.GIDMappings)
			}
			if sys.Type != "bind" || sys.Source != "/sys" || !slices.Contains(sys.Options, "ro") || !slices.Contains(sys.Options, "rbind") {
				t.Errorf("/sys mount %+v, want the host's sysfs bound read-only", sys)
			}
		})
	}
}

func TestIdmappedLayer(t *testing.T) {
	testutil.RequireRoot(t)
	layer := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(layer, "f"), []byte("x"), 0o644))
	must(os.Chown(filepath.Join(layer, "f"), 1000, 1000))
	r, err := New(Config{StateDir: filepath.Join(t.TempDir(), "s"), IdmapDir: filepath.Join(t.TempDir(), "idmap"), EnvdPath: "/bin/true", CgroupParent: "agentbox-test", UserNS: true, HookBinary: testHookBinary(t)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.ResetIdmaps)
	first, err := r.idmappedLayer(t.Context(), layer, 0, DefaultUserNSBase)
	if err != nil {
		t.Skipf("no idmapped mounts here: %v", err)
	}
	again, err := r.idmappedLayer(t.Context(), layer, 0, DefaultUserNSBase)
	if err != nil || again != first {
		t.Fatalf("second call = %q, %v; want the same mount %q", again, err, first)
	}
	var st unix.Stat_t
	must(unix.Stat(filepath.Join(first, "f"), &st))
	if st.Uid != DefaultUserNSBase+1000 || st.Gid != DefaultUserNSBase+1000 {
		t.Errorf("owner through the idmapped mount %d:%d, want %d", st.Uid, st.Gid, DefaultUserNSBase+1000)
	}
	if err := os.WriteFile(filepath.Join(first, "new"), nil, 0o644); err == nil {
		t.Error("the idmapped layer is writable")
	}
	must(unix.Stat(filepath.Join(layer, "f"), &st))
	if st.Uid != 1000 {
		t.Errorf("the layer itself changed owner: %d", st.Uid)
	}
	// One mount per layer and range, not one per call (a restart reuses it too).
	b, _ := os.ReadFile("/proc/self/mountinfo")
	if n := strings.Count(string(b), " "+first+" "); n != 1 {
		t.Errorf("%d mounts at %s, want 1", n, first)
	}
	// Another range gets a mount of its own, showing the same file as its ids.
	other := uint32(DefaultUserNSBase + DefaultUserNSSize)
	second, err := r.idmappedLayer(t.Context(), layer, 0, other)
	if err != nil || second == first {
		t.Fatalf("second range: %q, %v", second, err)
	}
	must(unix.Stat(filepath.Join(second, "f"), &st))
	if st.Uid != other+1000 {
		t.Errorf("owner through the second range's mount %d, want %d", st.Uid, other+1000)
	}
}

// A captured writable layer is stored unshifted: owners, setuid bits and
// file capabilities come back as they are in the sandbox.
func TestShiftTreeRoundTrip(t *testing.T) {
	testutil.RequireRoot(t)
	root := t.TempDir()
	f := filepath.Join(root, "ping")
	if err := os.WriteFile(f, []byte("x"), 0o4755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(f, 0o755|os.ModeSetuid); err != nil {
		t.Fatal(err)
	}
	v2 := make([]byte, vfsCapV2Size)
	binary.LittleEndian.PutUint32(v2, vfsCapRevision2|1) // effective
	binary.LittleEndian.PutUint32(v2[4:], 1<<13)         // CAP_NET_RAW
	if err := unix.Lsetxattr(f, "security.capability", v2, 0); err != nil {
		t.Skipf("no file capabilities here: %v", err)
	}
	const base uint32 = DefaultUserNSBase + 3*DefaultUserNSSize
	if err := shiftTree(root, 0, base, DefaultUserNSSize); err != nil {
		t.Fatal(err)
	}
	// overlayfs makes whiteouts in the upper with the mounter's ids (host
	// root), outside the sandbox's range: unshifting leaves them be.
	wh := filepath.Join(root, "deleted")
	if err := unix.Mknod(wh, unix.S_IFCHR|0o000, 0); err != nil {
		t.Fatal(err)
	}
	if got := getxattr(f, "security.capability"); len(got) != vfsCapV2Size+4 || binary.LittleEndian.Uint32(got[vfsCapV2Size:]) != base {
		t.Fatalf("shifted capability %x: want v3 owned by %d", got, base)
	}
	if err := shiftTree(root, base, 0, DefaultUserNSSize); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(f, &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != 0 || st.Gid != 0 || st.Mode&unix.S_ISUID == 0 {
		t.Errorf("unshifted: owner %d:%d mode %o, want 0:0 with setuid", st.Uid, st.Gid, st.Mode&0o7777)
	}
	if got := getxattr(f, "security.capability"); !bytes.Equal(got, v2) {
		t.Errorf("unshifted capability %x, want the original v2 %x", got, v2)
	}
	if err := unix.Lstat(wh, &st); err != nil || st.Uid != 0 {
		t.Errorf("whiteout: owner %d (%v), want 0", st.Uid, err)
	}
}

// testHookBinary is the test binary, by absolute path.
func testHookBinary(tb testing.TB) string {
	tb.Helper()
	p, err := os.Executable()
	if err != nil {
		tb.Fatal(err)
	}
	return p
}
